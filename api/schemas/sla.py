"""SLA contracts."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from api.schemas.common import InModel, OutModel, Seconds, UTCDatetime

Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class SlaIn(InModel):
    """A team's default terms; terms left out take the built-in defaults."""

    qos: Annotated[str, Field(max_length=32, pattern=r"^[a-z0-9-]+$")] = "silver"
    max_queue_wait_s: Seconds | None = None
    deadline: UTCDatetime | None = None
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    recovery_time_objective_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 300.0
    checkpoint_interval_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 600.0
    min_checkpoint_success_rate: Fraction = 0.999
    step_time_tolerance: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False)] = 1.3

    model_config = InModel.model_config | {
        "json_schema_extra": {"examples": [{"qos": "gold", "max_queue_wait_s": 300, "max_restarts": 5}]}
    }


class SlaOut(OutModel):
    team: str
    job_id: int | None = Field(description="None for the team's default contract.")
    qos: str
    max_queue_wait_s: float | None
    deadline: datetime | None
    max_restarts: int
    recovery_time_objective_s: float
    checkpoint_interval_s: float
    min_checkpoint_success_rate: float
    step_time_tolerance: float
    updated_at: datetime | None
    standing: dict[str, Literal["met", "violated", "unmeasured"]] | None = Field(
        default=None,
        description="A job's contract only: how it stands on the terms measured from its reported steps "
        "(step_time_tolerance, and deadline when set); 'unmeasured' until an attempt's pace could be compared "
        "(at least 125 steps over 25 s: a 10 s warm-up, a 10 s baseline, a 5 s recent window; a script that "
        "reports no steps never is), and step_time_tolerance always for a best-effort GPU share, to which no speed "
        "is promised.",
    )
