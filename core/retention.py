"""Retention: what a finished job leaves behind is thinned, then pruned, after configurable ages (core/settings.py,
``KILN_RETENTION_*``), so the database stays bounded under a steady workload (bench/retention_bench.py measures it).

Ages count from the job's end (``jobs.finished_at``); a job that has not finished keeps everything.

- per-step metrics, after ``metrics_downsample_days``: thinned to at most ``metric_points`` rows per job, evenly
  by step, the last kept; after ``metrics_days``: deleted;
- the job's events, after ``events_days``: deleted, except those ``/metrics`` counts for all time (preemptions,
  restarts, recoveries, SLA violations: deleting them would turn those counters down);
- webhook deliveries, ``deliveries_days`` after they were made (delivered or given up): deleted;
- log files and run directories, after ``logs_days``: deleted from storage (by the workers, which mount it).

The job row itself, its attempts, checkpoints, usage and contract stay: they are the job's result and its bill.
Audit events (tokens, memberships: no job) are kept. The scheduler's leader runs ``prune_database`` every
``retention_interval_s``; each worker's host agent runs ``prune_job_files``. Neither commits (the caller does).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Select, delete, func, or_, select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Event, Job, JobMetric, WebhookDelivery
from core.repositories.compile_cache import COMPILE_OK, INVALID, REJECTED
from core.settings import Settings
from core.states import TERMINAL

TERMINAL_STATES = sorted(s.value for s in TERMINAL)
# Event types /metrics counts over all time (core/repositories/ops_metrics.py, core/repositories/compile_cache.py;
# and SLA*): deleting them would turn those counters down, which Prometheus reads as a reset.
COUNTED_EVENT_TYPES = (EventType.PREEMPTING, EventType.QUEUED, EventType.RECOVERED, COMPILE_OK, REJECTED, INVALID)


@dataclass
class RetentionReport:
    metrics_thinned: int = 0
    metrics_deleted: int = 0
    events_deleted: int = 0
    deliveries_deleted: int = 0

    def __bool__(self) -> bool:
        return any(vars(self).values())


def _cutoff(now: datetime, days: float) -> datetime | None:
    return now - timedelta(days=days) if days > 0 else None


def _finished_before(cutoff: datetime) -> Select[int]:
    return select(Job.id).where(Job.state.in_(TERMINAL_STATES), Job.finished_at < cutoff)


def prune_database(db: Session, settings: Settings, now: datetime) -> RetentionReport:
    report = RetentionReport()
    if (cutoff := _cutoff(now, settings.retention_metrics_days)) is not None:
        result = db.execute(delete(JobMetric).where(JobMetric.job_id.in_(_finished_before(cutoff))))
        report.metrics_deleted = result.rowcount or 0  # type: ignore[attr-defined]
    if (cutoff := _cutoff(now, settings.retention_metrics_downsample_days)) is not None:
        report.metrics_thinned = thin_metrics(db, cutoff, settings.retention_metric_points)
    if (cutoff := _cutoff(now, settings.retention_events_days)) is not None:
        counted = or_(Event.type.in_(COUNTED_EVENT_TYPES), Event.type.like("SLA%"))
        result = db.execute(delete(Event).where(Event.job_id.in_(_finished_before(cutoff)), ~counted))
        report.events_deleted = result.rowcount or 0  # type: ignore[attr-defined]
    if (cutoff := _cutoff(now, settings.retention_deliveries_days)) is not None:
        result = db.execute(
            delete(WebhookDelivery).where(
                WebhookDelivery.status.in_(("delivered", "failed")),
                func.coalesce(WebhookDelivery.delivered_at, WebhookDelivery.last_attempt_at, WebhookDelivery.created_at)
                < cutoff,
            )
        )
        report.deliveries_deleted = result.rowcount or 0  # type: ignore[attr-defined]
    return report


def thin_metrics(db: Session, cutoff: datetime, points: int) -> int:
    """Keep at most ``points`` rows per job finished before ``cutoff``: every k-th step (k = ceil(rows/points))
    and the last. Idempotent: a job already thinned has no more than ``points`` rows and loses none."""
    points = max(points, 2)
    ranked = (
        select(
            JobMetric.id.label("id"),
            func.row_number().over(partition_by=JobMetric.job_id, order_by=(JobMetric.step, JobMetric.id)).label("rn"),
            func.count().over(partition_by=JobMetric.job_id).label("cnt"),
        )
        .where(JobMetric.job_id.in_(_finished_before(cutoff)))
        .subquery()
    )
    # The stride k = ceil((rows - 1) / (points - 1)): rows 1, 1+k, 1+2k... and the last are at most ``points``.
    every = (ranked.c.cnt + points - 3) // (points - 1)
    doomed = select(ranked.c.id).where(
        ranked.c.cnt > points, (ranked.c.rn - 1) % every != 0, ranked.c.rn != ranked.c.cnt
    )
    result = db.execute(delete(JobMetric).where(JobMetric.id.in_(doomed)))
    return result.rowcount or 0  # type: ignore[attr-defined]


def prune_job_files(db: Session, storage_dir: Path, settings: Settings, now: datetime) -> int:
    """Delete ``logs/<job>`` and ``runs/<job>`` of jobs finished more than ``logs_days`` ago; returns how many
    directories went. Reads only the job ids present on disk, so the cost follows what is kept, not history."""
    cutoff = _cutoff(now, settings.retention_logs_days)
    if cutoff is None:
        return 0
    dirs = [
        d
        for kind in ("logs", "runs")
        if (storage_dir / kind).is_dir()
        for d in (storage_dir / kind).iterdir()
        if d.is_dir() and d.name.isdigit()
    ]
    if not dirs:
        return 0
    ids = sorted({int(d.name) for d in dirs})
    old = set(db.scalars(_finished_before(cutoff).where(Job.id.in_(ids))).all())
    gone = 0
    for d in dirs:
        if int(d.name) in old:
            shutil.rmtree(d, ignore_errors=True)
            gone += 1
    return gone


def prune_local_tier(db: Session, jobs_dir: Path) -> int:
    """Delete this database's jobs' directories in the host's fast local checkpoint tier (``jobs_dir``:
    ``<tier>/<deployment uid>/jobs``) once the job has ended or is gone: an ended job never resumes, and the tier
    is usually memory (tmpfs), each directory up to ``keep_last`` checkpoints of the model. Returns how many went."""
    if not jobs_dir.is_dir():
        return 0
    dirs = {int(d.name): d for d in jobs_dir.iterdir() if d.is_dir() and d.name.isdigit()}
    if not dirs:
        return 0
    live = set(db.scalars(select(Job.id).where(Job.id.in_(dirs), Job.state.not_in(TERMINAL_STATES))).all())
    gone = 0
    for job_id, d in dirs.items():
        if job_id not in live:
            shutil.rmtree(d, ignore_errors=True)
            gone += 1
    return gone
