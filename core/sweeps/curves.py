"""A sweep's learning curves: each job's objective over its steps, best job first (the dashboard's sweep chart).

The objective's metric as its code's evaluations reported it (EVALUATION events), or the training loss the worker
relayed (``job_metrics``, read every ``steps // MAX_POINTS``-th step). A step reported twice (after a resume or a
rollback) keeps its latest value.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Event, Job, JobMetric
from core.services.principal import Principal
from core.sweeps import service as sweeps
from core.sweeps.ranking import LOSS, Objective

MAX_POINTS = 200  # per job, at most about this many points


@dataclass(frozen=True)
class Curve:
    job: Job
    points: list[tuple[int, float]]  # (step, value), by step


def _thinned(points: dict[int, float]) -> list[tuple[int, float]]:
    ordered = sorted(points.items())
    stride = max(1, -(-len(ordered) // MAX_POINTS))
    kept = ordered[::stride]
    if ordered and kept[-1] != ordered[-1]:
        kept.append(ordered[-1])  # the latest always
    return kept


def _losses(db: Session, job: Job) -> dict[int, float]:
    stride = max(1, int(job.spec.get("steps", 0) or 0) // MAX_POINTS)
    rows = db.execute(
        select(JobMetric.step, JobMetric.loss)
        .where(JobMetric.job_id == job.id, JobMetric.loss.is_not(None), JobMetric.step % stride == 0)
        .order_by(JobMetric.id)
    ).all()
    points = {int(step): float(loss) for step, loss in rows if loss is not None}
    if job.last_loss is not None and job.last_step:
        points[job.last_step] = job.last_loss
    return points


def evaluations(db: Session, job_ids: list[int], metric: str) -> dict[int, dict[int, float]]:
    """Each job's ``metric`` by the step its code evaluated it at (a step evaluated again: its latest value)."""
    rows = db.execute(
        select(Event.job_id, Event.data)
        .where(Event.job_id.in_(job_ids), Event.type == EventType.EVALUATION)
        .order_by(Event.id)
    ).all()
    found: dict[int, dict[int, float]] = {job_id: {} for job_id in job_ids}
    for job_id, data in rows:
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            continue
        value = (data.get("metrics") or {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[int(job_id)][data["step"]] = float(value)
    return found


def curves(*, db: Session, principal: Principal, sweep_id: int) -> tuple[Objective, list[Curve]]:
    """The sweep's objective and each of its jobs' curve of it, in the sweep's order (best first)."""
    view = sweeps.get(db=db, principal=principal, sweep_id=sweep_id)
    metric = view.objective.metric
    if metric == LOSS:
        return view.objective, [Curve(j, _thinned(_losses(db, j))) for j in view.jobs]
    evaluated = evaluations(db, [j.id for j in view.jobs], metric)
    return view.objective, [Curve(j, _thinned(evaluated[j.id])) for j in view.jobs]
