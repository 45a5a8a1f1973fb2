"""Early stopping of a sweep's jobs, by one of two rules on the sweep's evaluated objective
(``objective: {metric: accuracy, goal: maximize}``):

* the **median stopping rule** (Google Vizier's; Optuna's ``MedianPruner`` and Katib's ``medianstop``):
  ``early_stopping: {rule: median, min_jobs: 3, after_steps: 0}`` judges each job at every evaluation after
  ``after_steps``: when its value is worse than the median of the values the sweep's other jobs reported at the
  same step (at least ``min_jobs`` of them; a job that ended counts, a job's latest evaluation at a step counts
  once), it stops. A tie is not worse.
* **asynchronous successive halving** (ASHA, Li et al., MLSys 2020; Optuna's ``SuccessiveHalvingPruner``, Ray
  Tune's ``ASHAScheduler``, Determined's adaptive searchers): ``early_stopping: {rule: successive_halving,
  min_steps: 100, reduction_factor: 3, min_jobs: 3}`` sets rungs at 100, 300, 900, ... steps. A job's first
  evaluation in a rung (at or after its step, before the next rung's) is its value there, judged once, as it
  arrives: it goes on only if it is among the best ``max(1, n // reduction_factor)`` of the ``n`` values the sweep's
  jobs have had in that rung so far (its own included), when at least ``min_jobs`` others have one. Jobs that came
  early are judged against fewer, as ASHA's promotions are; a tie is not worse.

A stopped job is stopped as a cancel stops it (a checkpoint first) and ends ``CANCELLED`` with the reason
``stopped early: ...``. Jobs compare at the steps they evaluate at: before every checkpoint and at the end, so the
same ``checkpointing.every_steps`` gives them the same steps; a job's last step is never judged (it ends anyway).

The worker's telemetry relay calls ``stop_if_worse`` as an evaluation arrives, in the heartbeat's transaction, so
the same heartbeat tells the trainer to stop.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Job, Sweep
from core.sweeps.curves import evaluations
from core.sweeps.ranking import STOPPED_EARLY, Objective, objective_of
from core.sweeps.service import early_stopping_of
from core.sweeps.spec import EarlyStopping
from core.transitions import record_event


def median_to_beat(value: float, others: Sequence[float], objective: Objective, min_jobs: int) -> float | None:
    """The median of ``others`` when ``value`` is worse than it (so the job stops), else None (it goes on: fewer
    than ``min_jobs`` to compare with, or as good as the median or better)."""
    if len(others) < min_jobs:
        return None
    median = statistics.median(others)
    worse = value < median if objective.goal == "maximize" else value > median
    return median if worse else None


def rung_cutoff(
    value: float, others: Sequence[float], objective: Objective, reduction_factor: int, min_jobs: int
) -> tuple[int, float] | None:
    """Successive halving at one rung: when ``value`` is not among the best ``max(1, n // reduction_factor)`` of
    the ``n`` values (``others`` and it), how many go on and the worst value that does (so the job stops); None
    when it goes on, or fewer than ``min_jobs`` others reached the rung."""
    if len(others) < min_jobs:
        return None
    kept = max(1, (len(others) + 1) // reduction_factor)
    best_first = sorted(others, reverse=objective.goal == "maximize")
    better = sum(1 for v in others if (v > value if objective.goal == "maximize" else v < value))
    return None if better < kept else (kept, best_first[kept - 1])


def stop_if_worse(db: Session, *, job: Job, step: int, metrics: dict[str, float | None]) -> str | None:
    """Judge ``job``'s evaluation at ``step`` by its sweep's rule; when it is worse, ask it to stop (the caller holds
    the job's row lock) and return why. None when it goes on, or it is in no sweep that stops early."""
    if job.sweep_id is None or job.cancel_requested:
        return None
    sweep = db.get(Sweep, job.sweep_id)
    rule = early_stopping_of(sweep) if sweep is not None else None
    if sweep is None or rule is None or step >= int(job.spec.get("steps", 0)):
        return None  # in no sweep that stops early, or its last evaluation: it ends anyway
    objective = objective_of(sweep)
    value = metrics.get(objective.metric)
    if value is None:
        return None
    rung = rule.rung(step) if rule.rule == "successive_halving" else None
    if rule.rule == "successive_halving" and rung is None:
        return None  # before its first rung
    if rule.rule == "median" and step <= rule.after_steps:
        return None  # not judged until after after_steps
    # The evaluations of the metric by every job of the sweep (its own too), by step: one query for either rule.
    by_job = evaluations(db, list(db.scalars(select(Job.id).where(Job.sweep_id == sweep.id))), objective.metric)
    if rung is not None:
        found = _at_rung(by_job, sweep, job, step, value, objective, rule, rung)
    else:
        found = _below_median(by_job, sweep, job, step, value, objective, rule)
    if found is None:
        return None
    reason, data = found
    job.cancel_requested = True
    job.exit_reason = reason[:512]
    data = {"step": step, "metric": objective.metric, "value": value, "rule": rule.rule, **data}
    record_event(db, EventType.STOPPED_EARLY, job=job, message=reason, data=data)
    return reason


ByJob = dict[int, dict[int, float]]  # job id -> step -> value (``sweep_curves.evaluations``)


def _below_median(
    by_job: ByJob, sweep: Sweep, job: Job, step: int, value: float, objective: Objective, rule: EarlyStopping
) -> tuple[str, dict[str, Any]] | None:
    others = [values[step] for other, values in by_job.items() if other != job.id and step in values]
    median = median_to_beat(value, others, objective, rule.min_jobs)
    if median is None:
        return None
    reason = (
        f"{STOPPED_EARLY}: {objective.metric} {value:.4g} at step {step}, worse than the median of the "
        f"{len(others)} other jobs of sweep {sweep.id} there ({median:.4g})"
    )
    return reason, {"median": median, "compared": len(others)}


def _at_rung(
    by_job: ByJob,
    sweep: Sweep,
    job: Job,
    step: int,
    value: float,
    objective: Objective,
    rule: EarlyStopping,
    rung: tuple[int, int],
) -> tuple[str, dict[str, Any]] | None:
    start, end = rung
    if any(start <= s < step for s in by_job.get(job.id, {})):
        return None  # judged at this rung already, at its first evaluation there
    others = []
    for other, values in by_job.items():
        first = min((s for s in values if start <= s < end), default=None)
        if other != job.id and first is not None:
            others.append(values[first])
    cutoff = rung_cutoff(value, others, objective, rule.reduction_factor, rule.min_jobs)
    if cutoff is None:
        return None
    kept, worst_kept = cutoff
    reason = (
        f"{STOPPED_EARLY}: {objective.metric} {value:.4g} at step {step}, not among the best {kept} of the "
        f"{len(others) + 1} jobs of sweep {sweep.id} at rung {start} (successive halving by "
        f"{rule.reduction_factor}; the {_ordinal(kept)} best: {worst_kept:.4g})"
    )
    return reason, {"rung": start, "kept": kept, "compared": len(others), "cutoff": worst_kept}


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
