"""How a sweep's jobs are ranked: its objective (the loss, or a metric its jobs' code evaluates; lower or higher is
better) and the order it gives them, best first. Plain functions of the jobs' rows, so that what tells of a sweep
(its service, its webhooks) can rank it without the services that write events."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from core.spec import StrictModel
from core.states import JobState

if TYPE_CHECKING:  # the rows' types only: a sweep document is parsed without the database (core.sweeps.spec)
    from core.models import Job, Sweep

LOSS = "loss"  # the objective's metric that means the job's loss (its final loss once it succeeded)
STOPPED_EARLY = "stopped early"  # how the exit reason of a job its sweep's early stopping stopped begins


class Objective(StrictModel):
    """What ranks a sweep's jobs: the loss, or a metric its code's ``evaluate`` reports (``accuracy``)."""

    metric: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")] = LOSS
    goal: Literal["minimize", "maximize"] = "minimize"

    def rule(self) -> str:
        better = "lower" if self.goal == "minimize" else "higher"
        if self.metric == LOSS:
            return (
                f"succeeded jobs by final loss ({better} is better), then the others by their last loss, "
                "then those with none"
            )
        return (
            f"succeeded jobs by their last evaluated {self.metric} ({better} is better), then the others by "
            f"theirs, then those without one"
        )


def objective_of(sweep: Sweep) -> Objective:
    """The objective it was submitted with (sweeps stored before there was one rank by the loss)."""
    return Objective.model_validate((sweep.parameters or {}).get("objective") or {})


def evaluated(job: Job) -> dict[str, float]:
    """The job's last evaluation of its own code, ``{name: value}`` (empty without one)."""
    found = job.eval_metrics.get("metrics") if isinstance(job.eval_metrics, dict) else None
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def value_of(job: Job, objective: Objective) -> float | None:
    """The job's value of the objective: its (final, once it succeeded) loss, or its last evaluation of the metric."""
    return job.last_loss if objective.metric == LOSS else evaluated(job).get(objective.metric)


def stopped_early(job: Job) -> bool:
    """Its sweep's early stopping stopped it (``core.sweeps.stopping`` wrote its exit reason)."""
    return (job.exit_reason or "").startswith(STOPPED_EARLY)


def ranked(jobs: list[Job], objective: Objective | None = None) -> list[Job]:
    """Best first by the objective (``Objective.rule`` says it in words)."""
    objective = objective or Objective()
    sign = 1.0 if objective.goal == "minimize" else -1.0

    def key(job: Job) -> tuple[int, float, int]:
        value = value_of(job, objective)
        score = sign * value if value is not None and math.isfinite(value) else math.inf
        return (
            0 if job.state == JobState.SUCCEEDED and score < math.inf else 1 if score < math.inf else 2,
            score,
            job.id,
        )

    return sorted(jobs, key=key)
