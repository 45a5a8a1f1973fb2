"""Pure ASGI middlewares (no BaseHTTPMiddleware: they add no task per request): security headers, body limit and
metrics."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.bodies import MAX_DEPTH, DocumentError, check_json
from api.errors import PROBLEM_JSON, problem_body


async def _send_problem(
    send: Send, status: int, detail: str, path: str, *, errors: list[dict[str, Any]] | None = None
) -> None:
    body = json.dumps(problem_body(status, detail, instance=path, errors=errors)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """413 for bodies over ``max_bytes``: counts the bytes as they arrive (Content-Length is only a first check,
    a chunked or lying client is cut off at the limit), then replays the buffered body to the app. A JSON body (or
    one without a type, which FastAPI reads as JSON) nested deeper than ``max_depth`` answers 422 before anything
    parses it (``api.bodies.check_json``)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, streamed: re.Pattern[str] | None = None, max_depth: int = MAX_DEPTH
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = streamed  # PUT paths whose handler streams the body under a limit of its own
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.streamed is not None and scope.get("method") == "PUT" and self.streamed.match(path):
            await self.app(scope, receive, send)
            return
        too_large = f"the request body exceeds {self.max_bytes} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    await _send_problem(send, 400, "invalid Content-Length", path)
                    return
                if int(value) > self.max_bytes:
                    await _send_problem(send, 413, too_large, path)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_problem(send, 413, too_large, path)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if _json_typed(scope):  # every JSON body, the routes' own included: they need not check again
            try:
                check_json(body, self.max_depth)
            except DocumentError as refused:
                await _send_problem(send, 422, str(refused), path, errors=refused.errors)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect (SSE uses this)

        await self.app(scope, replay, send)


def _json_typed(scope: Scope) -> bool:
    """Whether the request's body is JSON as FastAPI reads bodies: typed ``application/json`` or ``...+json``, or
    not typed at all."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return True


class MetricsMiddleware:
    """Request counts and latency per method, route template and status (the template keeps cardinality low)."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry | None) -> None:
        """``registry`` None: registered nowhere, counted in prometheus_client's multiprocess files (api/metrics.py)."""
        self.app = app
        self.requests = Counter("kiln_http_requests", "HTTP requests", ["method", "route", "status"], registry=registry)
        self.latency = Histogram(
            "kiln_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}  # labelled series, resolved once each

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route: Any = scope.get("route")
            key = (scope.get("method", ""), getattr(route, "path", None) or "unmatched", status)
            children = self._children.get(key)
            if children is None:  # first time for this method, route and status: resolve the labelled series once
                method, template, _ = key
                children = (self.requests.labels(method, template, str(status)), self.latency.labels(method, template))
                if len(self._children) < 10_000:  # bounded (the route template and the status keep it small)
                    self._children[key] = children
            children[0].inc()
            children[1].observe(time.perf_counter() - start)


# Every page may load and talk only to this origin (the dashboard's token lives here: no script from elsewhere),
# be framed by nobody, and send no Referer; no response is sniffed into another type.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers that predate it
    (b"cross-origin-opener-policy", b"same-origin"),
)


class SecurityHeadersMiddleware:
    """The headers above on every response, errors and streams included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [h for h in SECURITY_HEADERS if h[0] not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
