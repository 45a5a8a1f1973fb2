"""Path and query parameter types, keyset cursors, and the error responses every /v1 operation documents."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Header, Path, Query

from api.schemas.common import INT64, problem_responses
from core.repositories.keyset import Window
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
    Query(
        max_length=1024,
        description="A stream ticket for this path (POST /v1/stream-tickets), for EventSource, "
        "which cannot send the Authorization header; a token is never accepted in a URL.",
    ),
]
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


# Pagination, one scheme for every list: ``?limit=`` (at most PAGE_MAX; each endpoint documents its own bounds)
# and ``?cursor=``, the ``next_cursor`` of the previous page (opaque; null on the last page). Positions are keysets
# (the last item's sort key), so an item added or removed between two pages neither repeats nor skips another.
PAGE_MAX = 500
PAGE_DEFAULT = 100
LimitQuery = Annotated[
    int, Query(ge=1, le=PAGE_MAX, description=f"At most this many items on the page (1..{PAGE_MAX})")
]
CursorQuery = Annotated[
    str | None,
    Query(
        max_length=512,
        description="The previous page's next_cursor: the page after it. Opaque; omit it for the first page.",
    ),
]
SortKey = tuple[int | str, ...]
T = TypeVar("T")


def encode_key_cursor(key: SortKey) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": list(key)}, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_key_cursor(cursor: str, like: SortKey) -> SortKey:
    """The sort key a cursor of ours holds, shaped like ``like`` (same length and types), or a 422 naming it."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        key = data["k"] if isinstance(data, dict) else None
    except (ValueError, KeyError, binascii.Error) as exc:
        raise InvalidInput.at("query.cursor", "not a cursor this API issued") from exc
    if (
        not isinstance(key, list)
        or len(key) != len(like)
        or any(type(a) is not type(b) or (type(a) is int and abs(a) > INT64) for a, b in zip(key, like, strict=True))
    ):
        raise InvalidInput.at("query.cursor", "not a cursor this API issued for this list")
    return tuple(key)


def paged(
    items: Iterable[T], key: Callable[[T], SortKey], limit: int, cursor: str | None
) -> tuple[list[T], str | None]:
    """One page of ``items`` in ascending ``key`` order (a descending column is a negated key), after the
    cursor's position; and the cursor of the next page (None: this is the last). For the short lists (a team's
    members, the QoS classes); those that grow with the deployment page in SQL (``paged_query``)."""
    ordered = sorted(items, key=key)
    if cursor is not None:
        after = decode_key_cursor(cursor, key(ordered[0])) if ordered else None
        ordered = [i for i in ordered if after is not None and key(i) > after]
    page = ordered[:limit]
    return page, encode_key_cursor(key(page[-1])) if len(ordered) > limit else None


def paged_query(
    fetch: Callable[..., Sequence[T]], key: Callable[[T], SortKey], like: SortKey, limit: int, cursor: str | None
) -> tuple[list[T], str | None]:
    """``paged`` for a list read a page at a time in SQL: ``fetch(window=...)`` returns the rows of a ``Window``
    (``core.repositories.keyset``) in ``key`` order; ``like`` is a key of the list's shape, to check a cursor by."""
    after = decode_key_cursor(cursor, like) if cursor is not None else None
    rows = list(fetch(window=Window(after, limit + 1)))
    page = rows[:limit]
    return page, encode_key_cursor(key(page[-1])) if len(rows) > limit else None


# Optimistic concurrency: a representation carries its version as an ETag; a change sent with ``If-Match`` is
# made only if that is still the current version (412 otherwise), so two editors never lose each other's update.
IfMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-Match",
        max_length=256,
        description="The ETag you read: change it only if still current (412 "
        "otherwise). Without it the change is made whatever the version.",
    ),
]
ETAG: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "ETag": {
                "description": "The version of what is shown (send it as If-Match to change it)",
                "schema": {"type": "string"},
            }
        }
    }
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
