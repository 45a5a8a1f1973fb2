"""Path and query parameter types, keyset cursors, and the error responses every /v1 operation documents."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Annotated, Any

from fastapi import Header, Path, Query

from api.schemas.common import INT64, problem_responses
from core.services.errors import InvalidInput, PreconditionFailed
from core.spec import NAME_PATTERN

TeamPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64, description="Team name", examples=["default"])]
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
UserPath = Annotated[str, Path(pattern=USER_PATTERN, description="User name")]
JobIdPath = Annotated[int, Path(ge=1, le=INT64, description="Job id")]
SweepIdPath = Annotated[int, Path(ge=1, le=INT64, description="Sweep id")]
QosPath = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", description="QoS class name")]
TeamQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=64, description="Only this team")]
QosQuery = Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$", description="Only this QoS class")]

ERROR_CODES = (400, 401, 403, 404, 409, 412, 413, 415, 422, 429, 500, 503)

# A 201 names what it created in a Location header (RFC 9110 15.3.2).
LOCATION: dict[int | str, dict[str, Any]] = {
    201: {"headers": {"Location": {"description": "The URL of what was created", "schema": {"type": "string"}}}}
}
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


# Optimistic concurrency: a representation carries its version as an ETag; a change sent with ``If-Match`` is
# made only if that is still the current version (412 otherwise), so two editors never lose each other's update.
IfMatchHeader = Annotated[
    str | None,
    Header(alias="If-Match", max_length=256, description="The ETag you read: change it only if still current (412 "
           "otherwise). Without it the change is made whatever the version."),
]  # fmt: skip
ETAG: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "ETag": {
                "description": "The version of what is shown (send it as If-Match to change it)",
                "schema": {"type": "string"},
            }
        }
    }  # fmt: skip
}


def etag(kind: str, version: int) -> str:
    """The ETag of a representation at ``version`` (an ETag is per URL: the kind only makes it readable)."""
    return f'"{kind}-v{version}"'


def if_match_version(header: str | None, kind: str) -> int | None:
    """The version an ``If-Match`` header asks for (None: no header, or ``*``); a tag that is none of this
    resource's can never match: 412."""
    if header is None or header.strip() == "*":
        return None
    for tag in header.split(","):
        found = re.fullmatch(rf'\s*(?:W/)?"{kind}-v(\d{{1,18}})"\s*', tag)
        if found:
            return int(found.group(1))
    raise PreconditionFailed(f"If-Match {header.strip()!r} is not a version of this {kind}: read it again for its ETag")
