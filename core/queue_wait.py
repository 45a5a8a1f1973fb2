"""How long a job has waited in the queue, as its queue-wait SLA measures it: every wait counts, the first and each
requeue after a preemption, a drain or a lost host (a restart backoff excluded: the wait resumes when the job may
start again), and no time the job ran or was held (``kiln hold``: the wait resumes at the release).

``core.transitions`` keeps the two columns: ``queued_s`` (the waits that ended) and ``wait_started_at`` (when the
current wait after a requeue or a release began; before the first admission the wait runs from submission). A held
job (``held_at`` set) is not waiting. The scheduler's snapshot hands ``plan()`` what is left of the budget from the
current wait, as the trace replay does (``scheduler/simulate/replay.py``), and the evaluator, the SLA page and
``/metrics`` all read the total here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, literal, null
from sqlalchemy.orm import Session

from core.db import UTCDateTime, seconds_between
from core.models import Job
from core.states import JobState, Reason

QUEUED = JobState.QUEUED.value
UNSCHEDULABLE = Reason.UNSCHEDULABLE.value


def waits_for_capacity(job: Job) -> bool:
    """Waiting as Unschedulable: no set of the hosts could ever hold it (``core.host_fit``). Such a wait is the
    cluster's shape, not the service falling behind, so no SLA term counts it: the evaluator, the SLA page and the
    attainment leave it out (hosts can leave after a job was accepted, and an operator may accept jobs beyond
    what has joined)."""
    return job.state == QUEUED and job.pending_reason == UNSCHEDULABLE


def waits_for_capacity_sql() -> ColumnElement[bool]:
    """``waits_for_capacity`` in SQL, never NULL (a NULL reason would make its negation NULL too)."""
    return and_(Job.state == QUEUED, Job.pending_reason.is_not_distinct_from(UNSCHEDULABLE))


def current_wait_start(job: Job) -> datetime | None:
    """When the wait the job is in began (None when it is not waiting: not QUEUED, or held)."""
    if job.state != QUEUED or job.held_at is not None:
        return None
    return job.wait_started_at or job.submitted_at


def queued_seconds(job: Job, now: datetime) -> float:
    """Seconds in the queue so far, all waits counted."""
    total = job.queued_s or 0.0
    begun = current_wait_start(job)
    if begun is not None:
        total += max(0.0, (now - begun).total_seconds())
    return total


def breached_at(job: Job, max_wait_s: float) -> datetime | None:
    """When the job's waits passed ``max_wait_s``, if that happened in the wait it is in (else unknown: None)."""
    begun = current_wait_start(job)
    left = max_wait_s - (job.queued_s or 0.0)
    if begun is None or left < 0:
        return None
    return begun + timedelta(seconds=left)


def current_wait_start_sql() -> ColumnElement[Any]:
    """``current_wait_start`` in SQL: NULL unless the job is QUEUED and not held."""
    waiting = and_(Job.state == QUEUED, Job.held_at.is_(None))
    return case((waiting, func.coalesce(Job.wait_started_at, Job.submitted_at)), else_=null())


def queued_seconds_sql(db: Session, now: datetime) -> ColumnElement[Any]:
    """``queued_seconds`` in SQL (PostgreSQL and SQLite alike)."""
    at = literal(now, UTCDateTime())
    begun = current_wait_start_sql()
    return Job.queued_s + case((begun < at, seconds_between(db, at, begun)), else_=literal(0.0))
