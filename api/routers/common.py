"""Path and query parameter types, keyset cursors, and the error responses every /v1 operation documents."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from fastapi import Path, Query

from api.schemas.common import INT64, problem_responses
from core.services.errors import InvalidInput
from core.spec import NAME_PATTERN

TeamPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64, description="Team name", examples=["default"])]
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
UserPath = Annotated[str, Path(pattern=USER_PATTERN, description="User name")]
JobIdPath = Annotated[int, Path(ge=1, le=INT64, description="Job id")]
QosPath = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", description="QoS class name")]
TeamQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=64, description="Only this team")]
QosQuery = Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", description="Only this QoS class")]

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


def encode_cursor(key: str, value: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({key: value}, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, key: str) -> int:
    """The position a cursor of ours holds under ``key``: a positive 64-bit integer, or a 422 naming the cursor
    (never a 500 for a cursor someone made up)."""
    try:
        pad = "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(cursor + pad))
        value = data[key] if isinstance(data, dict) else None
    except (ValueError, KeyError, binascii.Error) as exc:
        raise InvalidInput.at("query.cursor", "not a cursor this API issued") from exc
    if type(value) is not int or not 0 < value <= INT64:
        raise InvalidInput.at("query.cursor", "not a cursor this API issued")
    return value
