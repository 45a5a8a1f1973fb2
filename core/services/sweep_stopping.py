"""Early stopping of a sweep's jobs by the median stopping rule (Google Vizier's; Optuna's ``MedianPruner`` and
Katib's ``medianstop`` are the same idea).

A sweep with ``early_stopping: {rule: median, min_jobs: 3, after_steps: 0}`` and an evaluated objective
(``objective: {metric: accuracy, goal: maximize}``) judges each of its jobs at every evaluation after
``after_steps``: when the job's value is worse than the median of the values the sweep's other jobs reported at
the same step (at least ``min_jobs`` of them; a job that ended counts, a job's latest evaluation at a step counts
once), it is stopped as a cancel stops it (a checkpoint first) and ends ``CANCELLED`` with the reason ``stopped
early: ...``. A tie is not worse. Jobs compare at the steps they evaluate at: before every checkpoint and at the end,
so the same ``checkpointing.every_steps`` gives them the same steps.

The worker's telemetry relay calls ``stop_if_worse`` as an evaluation arrives, in the heartbeat's transaction, so
the same heartbeat tells the trainer to stop.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Job, Sweep
from core.services.sweep_curves import evaluations
from core.services.sweeps import early_stopping_of
from core.sweep_ranking import Objective, objective_of
from core.transitions import record_event


def median_to_beat(value: float, others: Sequence[float], objective: Objective, min_jobs: int) -> float | None:
    """The median of ``others`` when ``value`` is worse than it (so the job stops), else None (it goes on: fewer
    than ``min_jobs`` to compare with, or as good as the median or better)."""
    if len(others) < min_jobs:
        return None
    median = statistics.median(others)
    worse = value < median if objective.goal == "maximize" else value > median
    return median if worse else None


def stop_if_worse(db: Session, *, job: Job, step: int, metrics: dict[str, float | None]) -> str | None:
    """Judge ``job``'s evaluation at ``step`` by its sweep's rule; when it is worse, ask it to stop (the caller holds
    the job's row lock) and return why. None when it goes on, or it is in no sweep that stops early."""
    if job.sweep_id is None or job.cancel_requested:
        return None
    sweep = db.get(Sweep, job.sweep_id)
    rule = early_stopping_of(sweep) if sweep is not None else None
    if sweep is None or rule is None or step <= rule.after_steps or step >= int(job.spec.get("steps", 0)):
        return None  # not judged yet, or its last evaluation: it ends anyway
    objective = objective_of(sweep)
    value = metrics.get(objective.metric)
    if value is None:
        return None
    other_ids = list(db.scalars(select(Job.id).where(Job.sweep_id == sweep.id, Job.id != job.id)))
    by_step = evaluations(db, other_ids, objective.metric)
    others = [values[step] for values in by_step.values() if step in values]
    median = median_to_beat(value, others, objective, rule.min_jobs)
    if median is None:
        return None
    reason = (f"stopped early: {objective.metric} {value:.4g} at step {step}, worse than the median of the "
              f"{len(others)} other jobs of sweep {sweep.id} there ({median:.4g})")  # fmt: skip
    job.cancel_requested = True
    job.exit_reason = reason[:512]
    record_event(db, "STOPPED_EARLY", job=job, message=reason,
                 data={"step": step, "metric": objective.metric, "value": value, "median": median,
                       "compared": len(others)})  # fmt: skip
    return reason
