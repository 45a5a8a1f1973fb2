"""The dashboard's read-only queries that ``/v1`` has no use for: queue order and position, contracts, what moves a
job's page, usage windows, cluster occupancy (a job, its list, timeline and metrics: ``core.repositories.jobs``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, case, func, or_, select
from sqlalchemy.orm import Session

from core.models import (
    Attempt,
    Checkpoint,
    Event,
    Host,
    Job,
    QosClass,
    SlaContract,
    Team,
    Usage,
)
from core.states import JobState

# ---------------------------------------------------------------------------------------------------------------
# The queue


def _job_conditions(
    team_ids: Sequence[int], qos_class_id: int | None, submitted_after: datetime | None
) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = [Job.team_id.in_(team_ids)]
    if qos_class_id is not None:
        conds.append(Job.qos_class_id == qos_class_id)
    if submitted_after is not None:
        conds.append(Job.submitted_at >= submitted_after)
    return conds


def waiting_page(
    db: Session,
    *,
    team_ids: Sequence[int],
    qos_class_id: int | None,
    after_pos: int | None,
    limit: int,
    submitted_after: datetime | None = None,
) -> tuple[list[tuple[Job, int]], int]:
    """QUEUED jobs in the scheduler's base order (QoS priority, job priority, submission) with their position in
    the whole queue, after ``after_pos``: up to ``limit`` rows, and how many match in all. Held jobs come last
    (the scheduler does not plan them): a waiting job's position counts none of them."""
    # Position is over the whole queue (every team): "you are 57th", not "57th among what you can see".
    order = (Job.held_at.is_not(None).asc(), QosClass.priority.desc(), Job.priority.desc(), Job.id.asc())
    ranked = (
        select(Job.id.label("id"), func.row_number().over(order_by=order).label("pos"))
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .where(Job.state == JobState.QUEUED)
        .subquery()
    )
    conds = _job_conditions(team_ids, qos_class_id, submitted_after)
    total = db.scalar(select(func.count()).select_from(ranked).join(Job, Job.id == ranked.c.id).where(*conds))
    stmt = select(Job, ranked.c.pos).join(ranked, ranked.c.id == Job.id).where(*conds)
    if after_pos:
        stmt = stmt.where(ranked.c.pos > after_pos)
    stmt = stmt.order_by(ranked.c.pos.asc()).limit(limit)
    return [(j, int(p)) for j, p in db.execute(stmt).tuples()], int(total or 0)


def count_jobs_in(
    db: Session,
    *,
    team_ids: Sequence[int],
    qos_class_id: int | None,
    states: Sequence[str],
    submitted_after: datetime | None = None,
) -> int:
    """How many jobs in ``states`` match (the queue page's total; its rows are the job list's)."""
    conds = [*_job_conditions(team_ids, qos_class_id, submitted_after), Job.state.in_(states)]
    return int(db.scalar(select(func.count(Job.id)).where(*conds)) or 0)


def queue_groups(db: Session, *, team_ids: Sequence[int], states: Sequence[str]) -> Sequence[tuple[Any, ...]]:
    """(team name, QoS name, state, jobs, GPUs, oldest submission of a job not held) of the jobs in ``states``."""
    oldest = func.min(case((Job.held_at.is_(None), Job.submitted_at)))  # a held job does not wait for the scheduler
    stmt = (
        select(Team.name, QosClass.name, Job.state, func.count(Job.id), func.sum(Job.gpus), oldest)
        .join(Team, Team.id == Job.team_id)
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .where(Job.team_id.in_(team_ids), Job.state.in_(states))
        .group_by(Team.name, QosClass.name, Job.state)
    )
    return db.execute(stmt).tuples().all()


def pending_reason_counts(db: Session, *, team_ids: Sequence[int]) -> list[tuple[str | None, int]]:
    stmt = (
        select(Job.pending_reason, func.count(Job.id))
        .where(Job.team_id.in_(team_ids), Job.state == JobState.QUEUED)
        .group_by(Job.pending_reason)
    )
    return [(r, int(c)) for r, c in db.execute(stmt).tuples()]


def count_jobs(db: Session, *, team_id: int, states: Sequence[str]) -> int:
    return int(db.scalar(select(func.count(Job.id)).where(Job.team_id == team_id, Job.state.in_(states))) or 0)


# ---------------------------------------------------------------------------------------------------------------
# Contracts, SLA events and what moves a job's page


def job_contracts(db: Session, job_ids: Sequence[int]) -> Sequence[SlaContract]:
    return db.scalars(select(SlaContract).where(SlaContract.job_id.in_(job_ids))).all()


def team_default_contracts(db: Session, team_ids: Sequence[int]) -> Sequence[SlaContract]:
    return db.scalars(select(SlaContract).where(SlaContract.team_id.in_(team_ids), SlaContract.job_id.is_(None))).all()


def jobs_submitted_since(db: Session, *, team_ids: Sequence[int], since: datetime) -> list[Job]:
    return list(db.scalars(select(Job).where(Job.team_id.in_(team_ids), Job.submitted_at >= since)))


def sla_events_since(db: Session, *, team_ids: Sequence[int], since: datetime) -> Sequence[Event]:
    return db.scalars(
        select(Event).where(Event.team_id.in_(team_ids), Event.created_at >= since, Event.type.like("SLA%"))
    ).all()


def job_change_marks(db: Session, job_id: int) -> tuple[int | None, int]:
    """The job's newest event id and its checkpoint count: what moves when the job's page must be redrawn."""
    last_event = db.scalar(select(func.max(Event.id)).where(Event.job_id == job_id))
    checkpoints = db.scalar(select(func.count(Checkpoint.id)).where(Checkpoint.job_id == job_id))
    return last_event, int(checkpoints or 0)


# ---------------------------------------------------------------------------------------------------------------
# Cluster and usage


def current_attempts_of_jobs(db: Session, states: Sequence[str]) -> Sequence[tuple[Attempt, Job]]:
    """Each job in ``states`` with its current attempt (the one holding the job's fencing token)."""
    stmt = (
        select(Attempt, Job)
        .join(Job, Job.id == Attempt.job_id)
        .where(Job.state.in_(states), Attempt.fencing_token == Job.fencing_token)
    )
    return db.execute(stmt).tuples().all()


def hosts(db: Session) -> Sequence[Host]:
    return db.scalars(select(Host).order_by(Host.name)).all()


def job_resources(db: Session, states: Sequence[str]) -> Sequence[tuple[int, int, str | None, dict[str, Any] | None]]:
    """(team id, GPUs, GPU type, spec) of every job in ``states``."""
    return db.execute(select(Job.team_id, Job.gpus, Job.gpu_type, Job.spec).where(Job.state.in_(states))).tuples().all()


def usage_overlapping(
    db: Session, *, since: datetime, team_ids: Sequence[int] | None = None
) -> Sequence[tuple[int, str, float, datetime, datetime | None]]:
    """(team id, GPU type, GPU-seconds, start, end) of usage rows still open or ended at or after ``since``."""
    stmt = select(Usage.team_id, Usage.gpu_type, Usage.gpu_seconds, Usage.started_at, Usage.ended_at).where(
        or_(Usage.ended_at.is_(None), Usage.ended_at >= since)
    )
    if team_ids is not None:
        stmt = stmt.where(Usage.team_id.in_(team_ids))
    return db.execute(stmt).tuples().all()
