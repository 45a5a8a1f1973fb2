"""The state machines of jobs, attempts and hosts: the states as enums and the allowed transitions as data; also
the one vocabulary of why a queued job waits (``Reason``). Pure: the ORM's models take their defaults from here and
the policy reads it without a database. The functions that move a row from state to state are ``core.transitions``.
"""

from __future__ import annotations

import enum


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
# Every job that has not ended (queued, held or not, admitted, running, preempting, paused, lost): what a team's cap
# on its jobs counts (KILN_MAX_UNFINISHED_JOBS_PER_TEAM), in a fixed order for the SQL that names them.
UNFINISHED: tuple[str, ...] = tuple(sorted(s.value for s in JobState if s not in TERMINAL))


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
    **{
        ended: frozenset()
        for ended in (A.SUCCEEDED, A.FAILED, A.CANCELLED, A.PREEMPTED, A.DRAINED, A.LOST, A.FENCED, A.SUPERSEDED)
    },
}

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
    every cycle; the next three say how the job came back to the queue until the policy writes its own; ``Held``
    is written by the person who held the job and stays until it is released (the scheduler does not see it)."""

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
    HELD = "Held"  # held by a person (kiln hold, Slurm's JobHeldUser): it does not start until released


def can_transition(current: str, target: JobState) -> bool:
    return target in TRANSITIONS[JobState(current)]
