"""The state machines of jobs, attempts and hosts: the states as enums, the allowed transitions as data, and the
functions that move them. Also the one vocabulary of why a queued job waits (``Reason``).

Every job transition writes an event, so the timeline shown by the CLI and dashboard is complete by construction.
An attempt's or a host's change writes the event its caller chooses (``core.lifecycle``, the reconciler, the host
agent): the table here only says which changes can happen.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from core.models import Attempt, Event, Host, Job


class JobState(enum.StrEnum):
    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


S = JobState

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.ADMITTED, S.CANCELLED, S.FAILED}),
    S.ADMITTED: frozenset({S.RUNNING, S.QUEUED, S.CANCELLED, S.FAILED, S.LOST, S.SUCCEEDED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTING, S.PAUSED, S.LOST, S.QUEUED}),
    S.PREEMPTING: frozenset({S.QUEUED, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST}),
    S.PAUSED: frozenset({S.RUNNING, S.QUEUED, S.CANCELLED, S.FAILED, S.LOST}),
    S.LOST: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)
ACTIVE: frozenset[JobState] = frozenset({S.ADMITTED, S.RUNNING, S.PREEMPTING, S.PAUSED})


class AttemptState(enum.StrEnum):
    """One run of a job on its placement, under one fencing token."""

    PENDING = "PENDING"  # admitted and sent to its hosts; no worker has claimed it yet
    RUNNING = "RUNNING"  # claimed by a worker under the current token; holds a lease
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # the user's error, an OOM or the time limit: the job fails with it
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"  # stopped by the scheduler after a checkpoint; the job is back in the queue
    DRAINED = "DRAINED"  # stopped by its host's shutdown after a checkpoint; the job is back in the queue
    LOST = "LOST"  # an infrastructure failure: the job restarts elsewhere (or fails past max_restarts)
    FENCED = "FENCED"  # ended by its own worker after a newer attempt took the job
    SUPERSEDED = "SUPERSEDED"  # ended by the reconciler: the job had moved on while it was pending or silent


A = AttemptState

ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    A.PENDING: frozenset({A.RUNNING, A.CANCELLED, A.LOST, A.SUPERSEDED}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.CANCELLED, A.PREEMPTED, A.DRAINED, A.LOST, A.FENCED, A.SUPERSEDED}),
    **{ended: frozenset() for ended in (A.SUCCEEDED, A.FAILED, A.CANCELLED, A.PREEMPTED, A.DRAINED, A.LOST, A.FENCED,
                                        A.SUPERSEDED)},
}  # fmt: skip

# An attempt that has not ended: its GPUs are taken, and a worker may still claim or report it.
ATTEMPT_LIVE: frozenset[AttemptState] = frozenset(s for s, targets in ATTEMPT_TRANSITIONS.items() if targets)


class HostState(enum.StrEnum):
    UP = "UP"  # heartbeating and consuming its queue; its GPUs are placed on
    # heartbeating, but its worker has consumed nothing from its queue lately (the broker is away, or its Celery
    # consumer stopped): nothing is placed on it (workers/consumer_probe.py)
    UNREACHABLE = "UNREACHABLE"
    DOWN = "DOWN"  # its heartbeat went stale; nothing is placed on it
    EXCLUDED = "EXCLUDED"  # heartbeating, but a GPU raised a hardware error: it sits out until excluded_until


class MpsState(enum.StrEnum):
    """A GPU host's MPS daemon for fractional jobs (``hosts.mps``; NULL: the host runs none)."""

    RUNNING = "running"  # answering: the scheduler may place shares on the host
    RESTARTING = "restarting"  # found dead, being started again
    FAILED = "failed"  # did not start: no shares until it does
    STOPPED = "stopped"  # the worker stopped it on its way out


H = HostState

HOST_TRANSITIONS: dict[HostState, frozenset[HostState]] = {
    H.UP: frozenset({H.DOWN, H.EXCLUDED, H.UNREACHABLE}),  # heartbeat stale; a GPU's Xid/ECC error; consumer silent
    H.UNREACHABLE: frozenset({H.UP, H.DOWN, H.EXCLUDED}),  # consuming again; heartbeat stale; a GPU's error
    # heartbeating again (still EXCLUDED while its exclusion lasts; UNREACHABLE until its consumer is seen)
    H.DOWN: frozenset({H.UP, H.EXCLUDED, H.UNREACHABLE}),
    H.EXCLUDED: frozenset({H.UP, H.DOWN}),  # served its exclusion; heartbeat stale
}


class Reason(enum.StrEnum):
    """Why a queued job waits: Slurm's ``squeue`` REASON, kiln's vocabulary. The policy writes the first ten on
    every cycle; the last three say how the job came back to the queue until the policy writes its own."""

    QUOTA = "Quota"  # the team's quota (and what the cohort may lend) is used up
    BUDGET = "Budget"  # the team's GPU-hour budget for the period is spent
    RESOURCES = "Resources"  # not enough free GPUs / slots of the kind it needs (or a restart backoff)
    UNSCHEDULABLE = "Unschedulable"  # more than every host together has: it can start only once hosts join
    PRIORITY = "Priority"  # the capacity it could use is held for a higher-priority job
    DEPENDENCY = "Dependency"  # a job it depends on has not ended as its condition asks yet
    SWEEP_LIMIT = "SweepLimit"  # its sweep runs max_concurrent jobs already (Slurm's JobArrayTaskLimit)
    BANDWIDTH_QUOTA = "BandwidthQuota"  # GPUs are free but the host links cannot carry its bandwidth quota
    MEMORY_FIT = "MemoryFit"  # its predicted memory exceeds its QoS memory cap or every eligible GPU
    RESERVATION = "Reservation"  # capacity is being reserved for it (SLA, head of queue, or preemption)
    BACKOFF = "Backoff"  # requeued after an infrastructure failure; waits out its restart backoff
    PREEMPTED = "Preempted"  # requeued after a preemption, progress kept
    DRAINED = "Drained"  # requeued after its host shut down, progress kept


class IllegalTransition(ValueError):
    def __init__(self, subject: str, current: str, target: str):
        super().__init__(f"{subject}: {current} -> {target} is not allowed")
        self.current = current
        self.target = target


def can_transition(current: str, target: JobState) -> bool:
    return target in TRANSITIONS[JobState(current)]


def transition(
    session: Session,
    job: Job,
    target: JobState,
    *,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor_user_id: int | None = None,
    now: datetime | None = None,
) -> Event:
    """Move ``job`` to ``target`` and record the event; raises IllegalTransition. Does not commit.

    ``now`` is the caller's clock where it has one (the scheduler's cycle time), else the wall clock."""
    current = job.state
    if not can_transition(current, target):
        raise IllegalTransition(f"job {job.id}", current, target)
    from core.db import utcnow  # here, not at the top: the pure policy reads the states without the ORM
    from core.models import Event
    from core.webhooks import enqueue_for_event

    now = now or utcnow()
    job.state = target.value
    job.updated_at = now
    if target is S.ADMITTED:
        job.admitted_at = now
        job.pending_reason = None
        job.pending_message = None
    elif target is S.RUNNING and job.started_at is None:
        job.started_at = now
    elif target in TERMINAL:
        job.finished_at = now
        job.pending_reason = None
    event = Event(
        job_id=job.id,
        team_id=job.team_id,
        actor_user_id=actor_user_id,
        type=target.value,
        message=message or f"{current} -> {target.value}",
        data={"from": current, "to": target.value, **(data or {})},
        created_at=now,
    )
    session.add(event)
    enqueue_for_event(session, event, job)
    return event


def move_attempt(attempt: Attempt, target: AttemptState) -> None:
    """Move ``attempt`` to ``target``; raises IllegalTransition (an ended attempt never changes again)."""
    current = AttemptState(attempt.state)
    if target not in ATTEMPT_TRANSITIONS[current]:
        raise IllegalTransition(f"attempt {attempt.id}", current, target)
    attempt.state = target.value


def move_host(host: Host, target: HostState) -> None:
    """Move ``host`` to ``target`` (staying where it is is no change); raises IllegalTransition."""
    current = HostState(host.state)
    if target is not current and target not in HOST_TRANSITIONS[current]:
        raise IllegalTransition(f"host {host.name}", current, target)
    host.state = target.value


def record_event(
    session: Session,
    type_: str,
    *,
    job: Job | None = None,
    team_id: int | None = None,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor_user_id: int | None = None,
) -> Event:
    """A timeline or audit event that is not a state change (checkpoint, compile fallback, token issued...)."""
    from core.db import utcnow  # see transition
    from core.models import Event
    from core.webhooks import enqueue_for_event

    event = Event(
        job_id=job.id if job is not None else None,
        team_id=job.team_id if job is not None else team_id,
        actor_user_id=actor_user_id,
        type=type_,
        message=message,
        data=data or {},
        created_at=utcnow(),
    )
    session.add(event)
    if job is not None:
        enqueue_for_event(session, event, job)
    return event
