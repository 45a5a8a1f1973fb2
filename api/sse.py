"""What every Server-Sent Events stream of the API shares: the event format, keepalive comments, resuming from
``Last-Event-ID``, and the guard that checks the caller again while the stream is open.

* Keepalive: a comment line (``: keepalive``) after ``KILN_SSE_KEEPALIVE_S`` (15 s) without an event, so proxies
  and load balancers that close idle connections (commonly after 30-60 s) keep the stream, and a dead client is
  noticed.
* Resume: each event that carries progress has an ``id``; a client that reconnects sends the last one it saw as
  ``Last-Event-ID`` (EventSource does so by itself) or, when it opens a new stream with a new ticket, as the
  ``last_event_id`` query parameter, and the stream goes on right after it: no line or event is missed or repeated.
* Guard: every ``KILN_SSE_RECHECK_S`` (5 s) the stream reads the caller's token and memberships again; a revoked
  or expired token, or a caller no longer in the job's team, ends the stream (``event: end``,
  ``{"reason": "unauthorized"}``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.deps import SessionFactory
from core.services.auth import recheck
from core.services.errors import ServiceError
from core.services.principal import Principal
from core.settings import Settings

KEEPALIVE = ": keepalive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(name: str, data: Any, id_: str | None = None) -> str:
    """One event; ``data`` a string (split over ``data:`` lines) or anything JSON."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"id: {id_}\n" if id_ is not None else ""
    body = "".join(f"data: {line}\n" for line in text.split("\n"))
    return f"{head}event: {name}\n{body}\n"


def last_event_id(request: Request) -> str | None:
    """The id to resume after: the ``Last-Event-ID`` header (EventSource's reconnect) or the query parameter."""
    value = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    return value[:64] if value else None


def keepalive_s(request: Request) -> float:
    settings: Settings = request.app.state.settings
    return settings.sse_keepalive_s


class Guard:
    """Checks an open stream's caller again, at most every ``KILN_SSE_RECHECK_S``: its token still valid, and the
    job's team still visible to it."""

    def __init__(self, request: Request, sessions: SessionFactory, principal: Principal, team_id: int):
        settings: Settings = request.app.state.settings
        self.every_s = settings.sse_recheck_s
        self.sessions = sessions
        self.principal = principal
        self.team_id = team_id
        self.checked_at = time.monotonic()

    def _allowed(self) -> bool:
        with self.sessions() as db:
            try:
                now = recheck(db=db, principal=self.principal)
            except ServiceError:
                return False
        return now.can_see(self.team_id)

    def _due(self) -> bool:
        if time.monotonic() - self.checked_at < self.every_s:
            return False
        self.checked_at = time.monotonic()
        return True

    async def allowed(self) -> bool:
        return not self._due() or await run_in_threadpool(self._allowed)

    def allowed_now(self) -> bool:
        """The same check, from a thread that already runs outside the event loop."""
        return not self._due() or self._allowed()


UNAUTHORIZED = event("end", {"reason": "unauthorized"})
