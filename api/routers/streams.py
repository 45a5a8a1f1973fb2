"""Stream tickets: what a browser puts in a stream's URL instead of a token (EventSource cannot send headers).

``POST /v1/stream-tickets {"path": "/v1/jobs/7/logs"}`` (with the ``Authorization`` header) answers a ticket
that opens that one stream path for ``TICKET_TTL`` (core/services/auth.py); the stream then checks the token
behind it again while it runs. A token never appears in a URL, so no access log ever holds one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, status
from pydantic import Field

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS
from api.schemas.common import InModel, OutModel
from core.services import auth

router = APIRouter(prefix="/v1/stream-tickets", tags=["streams"], responses=ERRORS)

# The stream endpoints a ticket may open.
STREAM_PATH = r"^/v1/(jobs/[1-9][0-9]{0,18}/logs|dashboard/jobs/[1-9][0-9]{0,18}/stream)$"


class TicketIn(InModel):
    path: Annotated[str, Field(pattern=STREAM_PATH, examples=["/v1/jobs/7/logs"], description="The stream.")]


class TicketOut(OutModel):
    ticket: str = Field(description="Pass as ?ticket= to that stream, and only to it.")
    path: str
    expires_at: datetime = Field(description="Open the stream before this; an open stream outlives it.")


@router.post("", response_model=TicketOut, status_code=status.HTTP_201_CREATED, summary="A ticket for one stream")
def issue_stream_ticket(body: TicketIn, db: SessionDep, who: CurrentPrincipal) -> TicketOut:
    ticket, expires = auth.issue_ticket(db=db, principal=who, path=body.path)
    return TicketOut(ticket=ticket, path=body.path, expires_at=expires)
