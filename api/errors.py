"""RFC 9457 problem+json for every error the API can answer, from validation to an unreachable database.

Handlers map domain errors (core.services.errors), spec errors, HTTP errors, database failures and anything
unexpected to ``application/problem+json``; a 500 never carries a traceback (it is logged instead).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.deployment import StorageOfAnotherDeployment
from core.services.artifacts import TooLarge
from core.services.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    QueueFull,
    ServiceError,
    Unauthenticated,
)
from core.spec import SpecError

log = logging.getLogger("kiln.api")

PROBLEM_JSON = "application/problem+json"
PROBLEM_BASE = "https://kiln.dev/problems/"
DB_RETRY_AFTER_S = 5

SLUGS: Mapping[int, str] = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    409: "conflict",
    412: "precondition-failed",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "validation-error",
    429: "rate-limited",
    500: "internal-error",
    503: "unavailable",
}


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_JSON


def problem_body(
    status: int,
    detail: str = "",
    *,
    title: str | None = None,
    instance: str | None = None,
    errors: Sequence[Mapping[str, Any]] | None = None,
    slug: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + (slug or SLUGS.get(status, str(status))),
        "title": title or (HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"),
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors is not None:
        body["errors"] = [dict(e) for e in errors]
    return body


def problem(
    status: int,
    detail: str = "",
    *,
    request: Request | None = None,
    title: str | None = None,
    errors: Sequence[Mapping[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
    slug: str | None = None,
) -> ProblemResponse:
    instance = request.url.path if request is not None else None
    body = problem_body(status, detail, title=title, instance=instance, errors=errors, slug=slug)
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


def _loc(parts: Sequence[Any]) -> str:
    """FastAPI's ('body', 'resources', 'gpus') -> 'resources.gpus'; query/path/header keep their prefix."""
    items = [str(p) for p in parts]
    if items and items[0] == "body":
        items = items[1:]
    return ".".join(items) or "$"


def validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": _loc(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]


async def _validation(request: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, RequestValidationError)
    errors = validation_errors(exc)
    detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors[:3])
    return problem(422, detail, request=request, title="Request validation failed", errors=errors)


async def _spec(request: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, SpecError)
    return problem(422, str(exc), request=request, title="Invalid job spec", errors=exc.errors)


async def _service(request: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, ServiceError)
    if isinstance(exc, Unauthenticated):
        return problem(401, exc.detail, request=request, headers={"WWW-Authenticate": "Bearer"})
    if isinstance(exc, InvalidInput):
        return problem(422, exc.detail, request=request, title="Request validation failed", errors=exc.errors)
    if isinstance(exc, QueueFull):  # not a rate: room comes when the team's jobs end, so no Retry-After
        errors = [
            {"loc": "team", "msg": exc.detail, "type": "queue_full", "limit": exc.limit, "unfinished": exc.unfinished}
        ]
        return problem(
            429, exc.detail, request=request, title="Too many unfinished jobs", errors=errors, slug="queue-full"
        )
    status = {NotFound: 404, Forbidden: 403, Conflict: 409, PreconditionFailed: 412, TooLarge: 413}.get(type(exc), 400)
    return problem(status, exc.detail, request=request)


async def _http(request: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return problem(exc.status_code, detail, request=request, headers=exc.headers)


async def _unavailable(request: Request, exc: Exception) -> ProblemResponse:
    log.warning("database unavailable: %s", type(exc).__name__)
    return problem(
        503,
        "the database is unreachable; retry shortly",
        request=request,
        headers={"Retry-After": str(DB_RETRY_AFTER_S)},
    )


async def _foreign_storage(request: Request, exc: Exception) -> ProblemResponse:
    log.error("%s", exc)  # the paths and uids are for the operator's log, not for every caller
    return problem(
        503,
        "the API's storage directory belongs to another kiln database; an operator must point "
        "KILN_STORAGE_DIR or the database URL at the right one (the API's log says which)",
        request=request,
    )


async def _dbapi(request: Request, exc: Exception) -> ProblemResponse:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return await _unavailable(request, exc)
    return await _internal(request, exc)


async def _integrity(request: Request, exc: Exception) -> ProblemResponse:
    log.info("integrity error: %s", exc.__class__.__name__)
    return problem(409, "the change conflicts with existing data", request=request)


async def _data(request: Request, exc: Exception) -> ProblemResponse:
    errors = [{"loc": "$", "msg": "value out of range or not representable", "type": "data_error"}]
    return problem(422, "a value is out of range for the database", request=request, errors=errors)


async def _internal(request: Request, exc: Exception) -> ProblemResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem(500, "an internal error occurred; it has been logged", request=request)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(SpecError, _spec)
    app.add_exception_handler(ServiceError, _service)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OperationalError, _unavailable)
    app.add_exception_handler(StorageOfAnotherDeployment, _foreign_storage)
    app.add_exception_handler(PoolTimeout, _unavailable)
    app.add_exception_handler(IntegrityError, _integrity)
    app.add_exception_handler(DataError, _data)
    app.add_exception_handler(DBAPIError, _dbapi)
    app.add_exception_handler(Exception, _internal)
