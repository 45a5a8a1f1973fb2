"""Errors the CLI reports: one line (plus field details) and a distinct exit code, never a traceback."""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1  # a followed job ended FAILED / CANCELLED / LOST, or a generic failure
    USAGE = 2  # click's own code for bad arguments
    UNREACHABLE = 3  # connection refused, DNS, timeout
    UNAUTHORIZED = 4  # 401: no token, bad, expired or revoked token
    FORBIDDEN = 5  # 403
    NOT_FOUND = 6  # 404
    INVALID = 7  # 422 / 400 / local spec validation
    CONFLICT = 8  # 409
    RATE_LIMITED = 9  # 429 (a rate limit, or the team's queue is full)
    SERVER = 10  # 5xx
    INTERRUPTED = 130  # Ctrl-C


class CliError(Exception):
    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details or []


def _loc(value: Any) -> str:
    """A field path from problem+json: 'resources.gpus', ['body', 'resources', 'gpus'] -> 'resources.gpus'."""
    if isinstance(value, list | tuple):
        parts = [str(p) for p in value]
        if parts and parts[0] in {"body", "query", "path", "header"} and len(parts) > 1:
            parts = parts[1:]
        return ".".join(parts) or "$"
    return str(value) if value not in (None, "") else "$"


def field_errors(errors: Any) -> list[str]:
    """'path: message' lines from a problem's ``errors`` (a list of {loc|field|pointer, msg|message|detail})."""
    lines: list[str] = []
    if isinstance(errors, dict):  # {"field": "message"} or {"field": ["m1", "m2"]}
        for key, value in errors.items():
            for msg in value if isinstance(value, list) else [value]:
                lines.append(f"{key}: {msg}")
        return lines
    if not isinstance(errors, list):
        return lines
    for err in errors:
        if isinstance(err, dict):
            where = err.get("loc", err.get("field", err.get("pointer", err.get("path"))))
            msg = err.get("msg", err.get("message", err.get("detail", "")))
            lines.append(f"{_loc(where)}: {msg}")
        else:
            lines.append(str(err))
    return lines


def error_for_status(
    status: int,
    body: Any,
    *,
    url: str,
    method: str = "GET",
    retry_after: str | None = None,
    token_present: bool = True,
) -> CliError:
    """Map an HTTP error response (problem+json or anything else) onto a message and an exit code."""
    problem = body if isinstance(body, dict) else {}
    title = str(problem.get("title") or "")
    detail = problem.get("detail")
    if isinstance(detail, list):  # FastAPI's default 422 shape: {"detail": [{loc, msg}]}
        details = field_errors(detail)
        detail = None
    else:
        details = field_errors(problem.get("errors"))
    # With field errors listed underneath, the headline is the title: the detail would repeat the first of them.
    text = str((title if details and title else detail) or title or (body if isinstance(body, str) else "") or "")
    text = text.strip()
    if len(text) > 500:
        text = text[:500] + "…"

    def said(default: str) -> str:
        return text or default

    if status == 401:
        hint = (
            "no API token: run `kiln login` (or set KILN_TOKEN)"
            if not token_present
            else "the API token was refused (wrong, expired or revoked): run `kiln login` again"
        )
        return CliError(f"unauthorized: {said('authentication required')} — {hint}", ExitCode.UNAUTHORIZED, details)
    if status == 403:
        return CliError(f"forbidden: {said('your role does not allow this')}", ExitCode.FORBIDDEN, details)
    if status == 404:
        return CliError(f"not found: {said(f'{method} {url}')}", ExitCode.NOT_FOUND, details)
    if status == 409:
        return CliError(f"conflict: {said('the request conflicts with the current state')}", ExitCode.CONFLICT, details)
    if status in (400, 413, 415, 422):
        return CliError(f"invalid request: {said('the server rejected the request')}", ExitCode.INVALID, details)
    if status == 429 and str(problem.get("type") or "").endswith("/queue-full"):
        # Not a rate: the team's queue is full until some of its jobs end (KILN_MAX_UNFINISHED_JOBS_PER_TEAM).
        return CliError(f"too many unfinished jobs: {detail or title}", ExitCode.RATE_LIMITED)
    if status == 429:
        wait = f" (retry after {retry_after}s)" if retry_after else ""
        return CliError(f"rate limited: {said('too many requests')}{wait}", ExitCode.RATE_LIMITED, details)
    if status >= 500:
        return CliError(f"server error {status}: {said('the kiln API failed')}", ExitCode.SERVER, details)
    return CliError(f"HTTP {status}: {said('unexpected response')}", ExitCode.FAILURE, details)


def unreachable(url: str, reason: str) -> CliError:
    return CliError(
        f"cannot reach the kiln API at {url} ({reason}) — is `kiln up` running? "
        "(set the URL with `kiln login` or KILN_API_URL)",
        ExitCode.UNREACHABLE,
    )
