"""The functions that move jobs, attempts and hosts from state to state along ``core.states``' tables, and the
events they write.

Every job transition writes an event, so the timeline shown by the CLI and dashboard is complete by construction.
Events are all these functions write: the events deliverer (``core.outbox``) turns them into webhook deliveries and
sweep notices after they commit.
An attempt's or a host's change writes the event its caller chooses (``core.lifecycle``, the reconciler, the host
agent): the tables only say which changes can happen. Nothing here commits.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core.db import utcnow
from core.event_types import EventType
from core.models import Attempt, Event, Host, Job
from core.notify import notify_jobs_changed
from core.queue_wait import queued_seconds
from core.states import (
    ATTEMPT_TRANSITIONS,
    HOST_TRANSITIONS,
    TERMINAL,
    AttemptState,
    HostState,
    JobState,
    Reason,
    can_transition,
)


class IllegalTransition(ValueError):
    def __init__(self, subject: str, current: str, target: str):
        super().__init__(f"{subject}: {current} -> {target} is not allowed")
        self.current = current
        self.target = target


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
    now = now or utcnow()
    if current == JobState.QUEUED.value:
        end_wait(job, now)  # admitted, or cancelled or failed while it waited
        end_hold(job, now)  # cancelled or failed while held
    elif target is JobState.QUEUED and job.held_at is not None:
        # Held while it ran (``hold``): back in the queue held; the hold, and the pause of its wait, begin
        # now. The hold's pending reason and message stand (the requeue does not write its own).
        job.held_at = now
        job.pending_reason = Reason.HELD.value
    elif target is JobState.QUEUED:
        # A requeue (a preemption, a drain, a lost host): a new wait, from when the job may start again.
        job.wait_started_at = max(now, job.not_before) if job.not_before is not None else now
    elif target in TERMINAL:  # a hold asked of a running job that ended before it stopped
        drop_hold(job)
    job.state = target.value
    job.updated_at = now
    if target is JobState.ADMITTED:
        job.admitted_at = now
        job.pending_reason = None
        job.pending_message = None
    elif target is JobState.RUNNING and job.started_at is None:
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
    if target is JobState.LOST or target in TERMINAL:  # a job to requeue, or capacity freed: a cycle now
        notify_jobs_changed(session, str(job.id))
    return event


def end_wait(job: Job, now: datetime) -> None:
    """Add the wait that ends now (the job is still QUEUED) to ``job.queued_s``: the queue-wait SLA counts every
    wait (``core.queue_wait``)."""
    job.queued_s = queued_seconds(job, now)
    job.wait_started_at = None


def hold(
    session: Session,
    job: Job,
    *,
    by: str,
    reason: str | None,
    actor_user_id: int | None,
    now: datetime,
    admin_role: str | None = None,
) -> Event:
    """Hold a job until ``release``; its pending reason says who held it and why (``admin_role``: held by a team
    admin or an admin, named so; only a team admin or an admin releases such a hold: Slurm's admin hold). A QUEUED
    job: the scheduler leaves it be and its wait pauses (the wait so far is kept). An admitted or running job: its
    worker stops it as for a preemption (the trainer checkpoints first) and it comes back to the queue held
    (``transition``), to resume from that checkpoint once released; not a preemption, so neither the scheduler's
    victim order nor the preemption counts see it. The caller checks the state and holds the row lock."""
    who = f"{by} ({admin_role})" if admin_role else by
    job.pending_reason = Reason.HELD.value
    job.pending_message = (f"held by {who}" + (f": {reason}" if reason else ""))[:512]
    job.held_by_admin = admin_role is not None
    job.updated_at = now
    if job.state == JobState.QUEUED.value:
        end_wait(job, now)
        job.held_at = now
        return record_event(
            session,
            EventType.HELD,
            job=job,
            message=job.pending_message,
            data={"reason": reason},
            actor_user_id=actor_user_id,
            now=now,
        )
    job.held_at = now
    job.preempt_requested = True
    message = f"{job.pending_message}: stopping, checkpoint first, then back in the queue held"
    return record_event(
        session,
        EventType.HOLD_REQUESTED,
        job=job,
        message=message,
        data={"reason": reason},
        actor_user_id=actor_user_id,
        now=now,
    )


def release(session: Session, job: Job, *, by: str, actor_user_id: int | None, now: datetime) -> Event:
    """Release a held job: its wait resumes now (or when its restart backoff ends) and the scheduler plans it on
    its next cycle, which writes its pending reason. A running job whose hold was asked keeps running if its worker
    has not stopped it yet (if it has, it comes back to the queue as a preempted job does)."""
    if job.state == JobState.QUEUED.value:
        end_hold(job, now)
        job.wait_started_at = max(now, job.not_before) if job.not_before is not None else now
    else:  # still running: the hold was asked, not begun
        drop_hold(job)
        job.preempt_requested = False
    job.pending_reason = None
    job.pending_message = None
    job.updated_at = now
    return record_event(
        session, EventType.RELEASED, job=job, message=f"released by {by}", actor_user_id=actor_user_id, now=now
    )


def end_hold(job: Job, now: datetime) -> None:
    """Add the hold that ends now to ``job.held_s`` (the policy's backlog bound leaves held time out)."""
    if job.held_at is not None:
        job.held_s = (job.held_s or 0.0) + max(0.0, (now - job.held_at).total_seconds())
        drop_hold(job)


def drop_hold(job: Job) -> None:
    """The job is no longer held (nor is a hold asked of it)."""
    job.held_at = None
    job.held_by_admin = False


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
    now: datetime | None = None,
) -> Event:
    """A timeline or audit event that is not a state change (checkpoint, compile fallback, token issued...);
    ``now`` as in ``transition``."""
    event = Event(
        job_id=job.id if job is not None else None,
        team_id=job.team_id if job is not None else team_id,
        actor_user_id=actor_user_id,
        type=type_,
        message=message,
        data=data or {},
        created_at=now or utcnow(),
    )
    session.add(event)
    return event
