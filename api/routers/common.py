"""Path parameter types and the error responses every /v1 operation documents."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from api.schemas.common import INT64, problem_responses
from core.spec import NAME_PATTERN

TeamPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64, description="Team name", examples=["default"])]
UserPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$", description="User name")]
JobIdPath = Annotated[int, Path(ge=1, le=INT64, description="Job id")]
QosPath = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", description="QoS class name")]

ERROR_CODES = (400, 401, 403, 404, 409, 413, 415, 422, 429, 500, 503)
ERRORS = problem_responses(*ERROR_CODES)

# Stream endpoints: documented here, read by the stream dependency and api/sse.py.
StreamTicketQuery = Annotated[
    str | None,
    Query(max_length=1024, description="A stream ticket for this path (POST /v1/stream-tickets), for EventSource, "
          "which cannot send the Authorization header; a token is never accepted in a URL."),
]  # fmt: skip
LastEventIdQuery = Annotated[
    str | None,
    Query(max_length=64, description="Resume after this event id (as the Last-Event-ID header does)."),
]
