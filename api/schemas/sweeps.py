"""Sweeps: the jobs one submission expanded into, best first."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from api.schemas.common import NEXT_CURSOR_DOC, OutModel
from core.models import Job
from core.states import JobState
from core.sweeps.curves import Curve
from core.sweeps.ranking import Objective, evaluated
from core.sweeps.service import SweepView, early_stopping_of, section_of, setting
from core.sweeps.spec import MAX_JOBS


class SweepJobOut(OutModel):
    id: int
    name: str
    state: JobState
    settings: dict[str, Any] = Field(description="The values the sweep gave this job, by key.")
    last_step: int
    steps: int
    last_loss: float | None = Field(description="The final loss once SUCCEEDED; the latest before.")
    pending_reason: str | None
    held: bool = Field(description="Held: it does not start until released.")
    exit_reason: str | None = Field(
        description="Why it ended when it did not succeed (`stopped early: ...` by the "
        "sweep's early stopping, a failure, a cancel); null otherwise."
    )
    metrics: dict[str, float] = Field(
        default_factory=dict, description="The job's last evaluation of its own code ({name: value}), if any."
    )

    @classmethod
    def from_job(cls, j: Job, keys: list[str]) -> SweepJobOut:
        return cls(
            id=j.id,
            name=j.name,
            state=JobState(j.state),
            last_step=j.last_step,
            steps=int(j.spec.get("steps", 0)),
            last_loss=j.last_loss,
            pending_reason=j.pending_reason,
            held=j.held_at is not None,
            exit_reason=j.exit_reason,
            settings={k: setting(j, k) for k in keys},
            metrics=evaluated(j),
        )


class SweepObjective(OutModel):
    metric: str = Field(examples=["loss", "accuracy"], description="What ranks its jobs: loss, or an evaluated metric")
    goal: str = Field(examples=["minimize"], description="minimize: lower is better; maximize: higher is better")
    rule: str = Field(description="The ranking in words")


class SweepOut(OutModel):
    id: int
    name: str
    team: str
    user: str | None
    max_concurrent: int | None
    parameters: dict[str, Any] = Field(
        description="Its sweep section as submitted (the grid, list or random draws it "
        "expanded), with a random sweep's seed filled in."
    )
    keys: list[str] = Field(description="The settings it varies.")
    created_at: datetime
    objective: SweepObjective = Field(description="How its jobs are ranked, best first.")
    early_stopping: str | None = Field(
        description="Its early-stopping rule, in words (`parameters.early_stopping` "
        "has its settings); null when its jobs all run to the end."
    )
    search: str | None = Field(
        description="Its adaptive search (`search: tpe`), in words: how many random draws it "
        "starts with, then each next job proposed from the jobs that ended; null for a grid, "
        "a list or random draws, all submitted at once."
    )
    search_closed: str | None = Field(
        description="Why its search proposes no more jobs (all submitted, "
        "cancelled, a proposal refused); null while it proposes, or without a "
        "search."
    )
    jobs: list[SweepJobOut] = Field(
        description=f"Best first by the objective (at most {MAX_JOBS}; GET /v1/sweeps/{{id}}/jobs pages them by id)."
    )

    @classmethod
    def from_view(cls, view: SweepView) -> SweepOut:
        s = view.sweep
        jobs = [SweepJobOut.from_job(j, view.keys) for j in view.jobs]
        return cls(
            id=s.id,
            name=s.name,
            team=view.team,
            user=view.user,
            max_concurrent=s.max_concurrent,
            parameters=s.parameters,
            keys=view.keys,
            created_at=s.created_at,
            objective=SweepObjective(
                metric=view.objective.metric, goal=view.objective.goal, rule=view.objective.rule()
            ),
            early_stopping=None if (rule := early_stopping_of(s)) is None else rule.described(),
            search=section_of(s).described_search(),
            search_closed=s.closed_reason,
            jobs=jobs,
        )


class SweepCurveOut(OutModel):
    job_id: int
    name: str
    state: JobState
    points: list[tuple[int, float]] = Field(description="[step, value] by step (at most about 200)")


class SweepCurvesOut(OutModel):
    metric: str = Field(description="The sweep's objective: loss (the training loss) or an evaluated metric")
    goal: str
    curves: list[SweepCurveOut] = Field(description="Each job's curve of the objective, best job first.")

    @classmethod
    def from_curves(cls, objective: Objective, curves: list[Curve]) -> SweepCurvesOut:
        return cls(
            metric=objective.metric,
            goal=objective.goal,
            curves=[
                SweepCurveOut(job_id=c.job.id, name=c.job.name, state=JobState(c.job.state), points=c.points)
                for c in curves
            ],
        )


class SweepPageOut(OutModel):
    items: list[SweepOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; None = last page.")


class SweepJobPageOut(OutModel):
    items: list[SweepJobOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
