"""The job state machine: the allowed transitions as data, and the one function that moves a job.

Every transition writes an event, so the timeline shown by the CLI and dashboard is complete by construction.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Event, Job


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


class IllegalTransition(ValueError):
    def __init__(self, job_id: int, current: str, target: str):
        super().__init__(f"job {job_id}: {current} -> {target} is not allowed")
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
        raise IllegalTransition(job.id, current, target)
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
    return event


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
    return event
