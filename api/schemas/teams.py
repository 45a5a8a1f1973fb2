"""Teams, quotas, memberships."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator

from api.schemas.common import INT32, NEXT_CURSOR_DOC, GpuType, InModel, Int32, OutModel, TeamName, UserName

MemberRole = Literal["team-admin", "member", "viewer"]
Weight = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
Budget = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
Cohort = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")]
QosName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", examples=["silver"])]
QosNames = Annotated[list[QosName], Field(max_length=64)]
RestartLimit = Annotated[int, Field(ge=0, le=1000, description="The most restarts a contract of the team may ask.")]


class QuotaIn(InModel):
    gpu_type: GpuType = Field(description="A GPU model such as 'H200', '*' for any type, 'cpu' for CPU slots.")
    nominal: Int32 = 0
    borrowing_limit: Int32 | None = Field(default=None, description="None = unlimited within the cohort.")
    lending_limit: Int32 | None = Field(default=None, description="None = all unused nominal may be lent.")


class QuotaOut(OutModel):
    gpu_type: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


class TeamCreate(InModel):
    name: TeamName
    cohort: Cohort | None = None
    fair_share_weight: Weight = 1.0
    gpu_hour_budget: Budget | None = Field(default=None, description="GPU-hours per budget period; None = none.")
    budget_period_s: Annotated[int, Field(ge=3600, le=INT32)] = 30 * 86400
    quotas: Annotated[list[QuotaIn], Field(max_length=64)] = []
    qos_classes: QosNames | None = Field(
        default=None, description="The QoS classes the team may use; default silver, bronze and best-effort."
    )
    restart_limit: RestartLimit = 10

    model_config = InModel.model_config | {
        "json_schema_extra": {
            "examples": [
                {
                    "name": "vision",
                    "cohort": "research",
                    "fair_share_weight": 2.0,
                    "gpu_hour_budget": 5000,
                    "quotas": [{"gpu_type": "H200", "nominal": 8, "borrowing_limit": 8, "lending_limit": 4}],
                }
            ]
        }
    }


class TeamUpdate(InModel):
    """Only the fields sent change; ``quotas`` replaces the whole list."""

    cohort: Cohort | None = None
    fair_share_weight: Weight | None = None
    gpu_hour_budget: Budget | None = None
    budget_period_s: Annotated[int, Field(ge=3600, le=INT32)] | None = None
    quotas: Annotated[list[QuotaIn], Field(max_length=64)] | None = None
    qos_classes: QosNames | None = Field(default=None, description="Replaces the classes the team may use.")
    restart_limit: RestartLimit | None = None


class TeamOut(OutModel):
    id: int
    name: str
    cohort: str | None
    fair_share_weight: float
    gpu_hour_budget: float | None
    budget_period_s: int
    quotas: list[QuotaOut]
    qos_classes: list[str] = Field(description="The QoS classes the team may use (an admin's decision).")
    restart_limit: int
    created_at: datetime

    @field_validator("qos_classes", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, list):
            return [getattr(q, "name", q) for q in value]
        return value


class MemberIn(InModel):
    role: MemberRole = Field(examples=["member"])


class MemberOut(OutModel):
    team: str
    user: UserName
    role: str
    created_at: datetime
    status: Literal["member", "invited"] = Field(
        default="member", description="invited: the user joins by accepting (POST /v1/me/invitations/{team}/accept)"
    )
    expires_at: datetime | None = Field(default=None, description="When an invitation lapses.")


class InvitationOut(OutModel):
    team: str
    user: str
    role: str
    invited_by: str | None
    created_at: datetime
    expires_at: datetime


class TeamPageOut(OutModel):
    items: list[TeamOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


class MemberPageOut(OutModel):
    items: list[MemberOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


class InvitationPageOut(OutModel):
    items: list[InvitationOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
