"""Sweeps: the jobs one submission expanded into, best first."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from api.schemas.common import OutModel
from core.services.sweeps import SweepView, setting
from core.states import JobState


class SweepJobOut(OutModel):
    id: int
    name: str
    state: JobState
    settings: dict[str, Any] = Field(description="The values the sweep gave this job, by key.")
    last_step: int
    steps: int
    last_loss: float | None = Field(description="The final loss once SUCCEEDED; the latest before.")
    pending_reason: str | None


class SweepOut(OutModel):
    id: int
    name: str
    team: str
    user: str | None
    max_concurrent: int | None
    parameters: dict[str, Any] = Field(description="The grid or list it expanded, as submitted.")
    keys: list[str] = Field(description="The settings it varies.")
    created_at: datetime
    jobs: list[SweepJobOut] = Field(description="Best first: succeeded jobs by final loss, then the others.")

    @classmethod
    def from_view(cls, view: SweepView) -> SweepOut:
        s = view.sweep
        jobs = [
            SweepJobOut(id=j.id, name=j.name, state=JobState(j.state), last_step=j.last_step,
                        steps=int(j.spec.get("steps", 0)), last_loss=j.last_loss, pending_reason=j.pending_reason,
                        settings={k: setting(j, k) for k in view.keys})
            for j in view.jobs
        ]  # fmt: skip
        return cls(id=s.id, name=s.name, team=view.team, user=view.user, max_concurrent=s.max_concurrent,
                   parameters=s.parameters, keys=view.keys, created_at=s.created_at, jobs=jobs)  # fmt: skip


class SweepPageOut(OutModel):
    items: list[SweepOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; None = last page.")
