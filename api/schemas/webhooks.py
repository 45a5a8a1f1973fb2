"""Webhooks and their delivery log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from api.schemas.common import INT64, NEXT_CURSOR_DOC, InModel, OutModel, TeamName, Text
from core.webhook_kinds import EventKind

WebhookUrl = Annotated[
    str, Field(min_length=8, max_length=2048, pattern=r"^https?://[^\s]+$", examples=["https://hooks.example.com/kiln"])
]


class WebhookCreate(InModel):
    team: TeamName | None = Field(default=None, description="Every job of this team (team-admins).")
    job_id: Annotated[int, Field(ge=1, le=INT64)] | None = Field(default=None, description="Only this job (members).")
    url: WebhookUrl
    events: Annotated[list[EventKind], Field(min_length=1, max_length=7)] = ["finished", "failed"]
    format: Literal["json", "slack"] = Field(
        default="json", description='slack: a {"text": ...} body for a Slack incoming-webhook URL.'
    )
    description: Text = ""

    model_config = InModel.model_config | {
        "json_schema_extra": {
            "examples": [
                {
                    "team": "default",
                    "url": "https://hooks.example.com/kiln",
                    "events": ["finished", "failed", "sla_violation"],
                }
            ]
        }
    }


class WebhookOut(OutModel):
    id: int
    team: str
    job_id: int | None
    url: str
    events: list[str]
    format: str
    description: str
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (HMAC-SHA256), shown only this once.")


class DeliveryOut(OutModel):
    id: int
    webhook_id: int
    kind: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime
    last_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    payload: dict[str, Any]


class WebhookPageOut(OutModel):
    items: list[WebhookOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


class DeliveryPageOut(OutModel):
    items: list[DeliveryOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
