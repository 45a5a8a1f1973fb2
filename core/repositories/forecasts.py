"""Forecast rows, and the measurements a forecast is settled against (the job's attempts, step metrics, usage)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from core.forecast_errors import START_TIME
from core.models import Attempt, Forecast, Job, JobMetric, Usage
from core.repositories import estimates as estimates_repo


def get(db: Session, *, job_id: int, kind: str, source: str) -> Forecast | None:
    stmt = select(Forecast).where(Forecast.job_id == job_id, Forecast.kind == kind, Forecast.source == source)
    return db.scalars(stmt).first()


def of_job(db: Session, job_id: int) -> list[Forecast]:
    stmt = select(Forecast).where(Forecast.job_id == job_id).order_by(Forecast.kind, Forecast.source)
    return list(db.scalars(stmt))


def never_forecast(db: Session, *, kind: str, source: str, job_ids: Collection[int]) -> list[Job]:
    """Those of ``job_ids`` that have never started and have no forecast of ``kind`` by ``source`` yet, oldest
    first."""
    if not job_ids:
        return []
    made = select(Forecast.id).where(Forecast.job_id == Job.id, Forecast.kind == kind, Forecast.source == source)
    stmt = select(Job).where(Job.id.in_(list(job_ids)), Job.started_at.is_(None), ~made.exists()).order_by(Job.id)
    return list(db.scalars(stmt))


def due(db: Session) -> list[tuple[Forecast, Job]]:
    """Unsettled forecasts whose job can now tell: a start once the job has started or ended, the rest once it has
    ended."""
    stmt = (
        select(Forecast, Job)
        .join(Job, Job.id == Forecast.job_id)
        .where(
            Forecast.settled_at.is_(None),
            or_(Job.finished_at.is_not(None), (Forecast.kind == START_TIME) & Job.started_at.is_not(None)),
        )
        .order_by(Forecast.id)
    )
    return list(db.execute(stmt).tuples())


def first_start(db: Session, job_id: int) -> datetime | None:
    """When the job's first attempt began to run."""
    return db.scalar(select(func.min(Attempt.started_at)).where(Attempt.job_id == job_id))


def peak_memory(db: Session, job_id: int) -> int | None:
    """The highest peak memory any step of the job reported (rank 0's, bytes)."""
    value = db.scalar(select(func.max(JobMetric.mem_peak_bytes)).where(JobMetric.job_id == job_id))
    return int(value) if value is not None else None


def step_times(db: Session, job_id: int) -> list[float]:
    """The job's steady step times, as ``kiln estimate`` reads a run's (``estimates.steady_steps``: no warm-up, no
    step that kiln's own checkpoint or restore overlapped), over all its attempts."""
    attempts = list(db.scalars(select(Attempt.id).where(Attempt.job_id == job_id)))
    return [t for steps in estimates_repo.steady_steps(db, attempts).values() for t, _ in steps]


def gpu_seconds(db: Session, job_id: int) -> float | None:
    """GPU-seconds (CPU slot-seconds for a CPU job) over all the job's attempts; None when none ran."""
    value = db.scalar(select(func.sum(Usage.gpu_seconds)).where(Usage.job_id == job_id))
    return float(value) if value is not None else None


def made_between(
    db: Session, *, team_ids: Sequence[int], since: datetime, until: datetime
) -> list[tuple[str, str, float | None, float | None, float | None]]:
    """Forecasts of these teams made in [since, until): (kind, source, predicted, actual, predicted_high)."""
    if not team_ids:
        return []
    stmt = (
        select(Forecast.kind, Forecast.source, Forecast.predicted, Forecast.actual, Forecast.predicted_high)
        .where(Forecast.team_id.in_(team_ids), Forecast.made_at >= since, Forecast.made_at < until)
        .order_by(Forecast.kind, Forecast.source)
    )
    return list(db.execute(stmt).tuples())
