"""Aggregate queries behind the operators' Prometheus metrics (core/services/ops_metrics.py).

Each function is one statement whose cost does not grow with the number of label values (no N+1): the windowed
ones read jobs submitted or admitted since ``since``; the event counters read the few event types they count.
Portable to SQLite (the single-host ``kiln up``), PostgreSQL being the one that matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, SQLColumnExpression, and_, case, exists, false, func, literal, or_, select
from sqlalchemy.orm import Session, aliased

from core.event_types import EventType
from core.models import GPU, Event, Host, Job, QosClass, SlaContract, Team
from core.queue_wait import queued_seconds_sql, waits_for_capacity_sql
from core.states import JobState

# Event types counted by ``event_counts``.
PREEMPTING = JobState.PREEMPTING.value
RECOVERED = EventType.RECOVERED
QUEUED = JobState.QUEUED.value
LOST = JobState.LOST.value


def is_violation_type(column: SQLColumnExpression[str]) -> ColumnElement[bool]:
    """SQL twin of the SLA page's test (``core.services.ops_metrics.is_violation_event``): an ``SLA*`` event
    whose type says VIOLAT(ED/ION), BREACH, MISS or EXCEED."""
    upper = func.upper(column)
    return and_(
        column.like("SLA%"),
        or_(*(upper.like(f"%{word}%") for word in ("VIOLAT", "BREACH", "MISS", "EXCEED"))),
    )


def attainment(db: Session, *, since: datetime, now: datetime) -> Sequence[tuple[Any, ...]]:
    """(team, qos, jobs, met) over jobs submitted since ``since``, by the SLA page's definition: a job attains
    its SLA unless its waits in the queue (``core.queue_wait``: the first and every requeue, a job still queued
    counting its wait so far) add up to more than its contract's maximum (own contract, spec, team default, QoS
    default, the first that is set) or an SLA violation event was
    recorded on it since ``since``."""
    own = aliased(SlaContract)
    team_default = (
        select(SlaContract.max_queue_wait_s)
        .where(SlaContract.team_id == Job.team_id, SlaContract.job_id.is_(None))
        .order_by(SlaContract.id)
        .limit(1)
        .scalar_subquery()
    )
    limit = func.coalesce(
        own.max_queue_wait_s,
        Job.spec[("sla", "max_queue_wait_s")].as_float(),
        team_default,
        QosClass.default_max_queue_wait_s,
    )
    queue_violation = and_(limit.is_not(None), ~waits_for_capacity_sql(), queued_seconds_sql(db, now) > limit)
    event_violation = exists().where(Event.job_id == Job.id, Event.created_at >= since, is_violation_type(Event.type))
    met = case((or_(queue_violation, event_violation), 0), else_=1)
    stmt = (
        select(Team.name, QosClass.name, func.count(), func.sum(met))
        .select_from(Job)
        .join(Team, Team.id == Job.team_id)
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .outerjoin(own, own.job_id == Job.id)
        .where(Job.submitted_at >= since)
        .group_by(Team.name, QosClass.name)
    )
    return db.execute(stmt).tuples().all()


def queue_wait_buckets(db: Session, *, since: datetime, bounds: Sequence[float]) -> Sequence[tuple[Any, ...]]:
    """Per QoS class over jobs admitted since ``since``: (qos, n <= bounds[0], n <= bounds[1], ..., count, sum of
    seconds) of their time in the queue, all waits counted (``core.queue_wait``)."""
    wait = Job.queued_s
    stmt = (
        select(
            QosClass.name,
            *(func.sum(case((wait <= b, 1), else_=0)) for b in bounds),
            func.count(),
            func.sum(wait),
        )
        .select_from(Job)
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .where(Job.admitted_at >= since)
        .group_by(QosClass.name)
    )
    return db.execute(stmt).tuples().all()


def pending_by_reason(db: Session) -> Sequence[tuple[Any, ...]]:
    """(pending reason, qos, jobs) over QUEUED jobs (the ``ix_jobs_state_id`` index)."""
    stmt = (
        select(Job.pending_reason, QosClass.name, func.count())
        .select_from(Job)
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .where(Job.state == QUEUED)
        .group_by(Job.pending_reason, QosClass.name)
    )
    return db.execute(stmt).tuples().all()


def event_counts(db: Session, *, recovery_bounds: Sequence[float]) -> Sequence[tuple[Any, ...]]:
    """All-time counts of the counted events (monotonic, as Prometheus counters must be), in one statement:

    (type, team, qos, label, bucket, count, sum of recovery seconds) where, by type,

    - ``PREEMPTING``: label NULL;
    - ``QUEUED`` with ``data.restart_count`` (a restart after an infrastructure failure): label = the
      ``incident`` of the LOST event just before it (lease_expired, never_started, infrastructure, nccl_error);
    - ``RECOVERED``: label ``recovery_time`` when ``data.met`` is false (else NULL), bucket = index of the first
      of ``recovery_bounds`` >= ``data.recovery_time_s`` (``len(recovery_bounds)`` = +Inf);
    - ``SLA*`` violation events: label = ``data.kind`` (NULL: the caller derives it from the type).
    """
    is_restart = and_(Event.type == QUEUED, Event.data["restart_count"].as_string().is_not(None))
    lost = aliased(Event)
    incident = (
        select(lost.data["incident"].as_string())
        .where(lost.job_id == Event.job_id, lost.id < Event.id, lost.type == LOST)
        .order_by(lost.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    recovery = Event.data["recovery_time_s"].as_float()
    is_recovered = Event.type == RECOVERED
    label = case(
        (is_restart, incident),
        (and_(is_recovered, Event.data["met"].as_boolean() == false()), literal("recovery_time")),
        (is_violation_type(Event.type), Event.data["kind"].as_string()),
        else_=None,
    )
    bucket = case(
        (or_(~is_recovered, recovery.is_(None)), -1),
        *((recovery <= b, i) for i, b in enumerate(recovery_bounds)),
        else_=len(recovery_bounds),
    )
    recovery_sum = func.sum(case((is_recovered, recovery), else_=None))
    stmt = (
        select(Event.type, Team.name, QosClass.name, label, bucket, func.count(), recovery_sum)
        .select_from(Event)
        .join(Job, Job.id == Event.job_id)
        .join(Team, Team.id == Job.team_id)
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .where(
            or_(Event.type.in_((PREEMPTING, RECOVERED)), is_restart, is_violation_type(Event.type)),
        )
        .group_by(Event.type, Team.name, QosClass.name, label, bucket)
    )
    return db.execute(stmt).tuples().all()


def hosts_and_gpus(db: Session) -> Sequence[tuple[Any, ...]]:
    """(host, host state, GPU uuid, GPU last sample), one row per GPU and one (uuid NULL) per host without any."""
    stmt = (
        select(Host.name, Host.state, GPU.uuid, GPU.last_sample)
        .select_from(Host)
        .outerjoin(GPU, GPU.host_id == Host.id)
        .order_by(Host.name, GPU.index)
    )
    return db.execute(stmt).tuples().all()


def evaluations(db: Session, *, since: datetime) -> Sequence[tuple[Any, ...]]:
    """(team, job id, job name, eval_metrics) of the jobs with an evaluation that are active or ended since
    ``since`` (a team's own code: ``{"step", "metrics"}``)."""
    active = [JobState.ADMITTED.value, JobState.RUNNING.value, JobState.PREEMPTING.value, JobState.PAUSED.value]
    stmt = (
        select(Team.name, Job.id, Job.name, Job.eval_metrics)
        .join(Team, Team.id == Job.team_id)
        .where(Job.eval_metrics.is_not(None), or_(Job.state.in_(active), Job.finished_at >= since))
    )
    return db.execute(stmt).all()
