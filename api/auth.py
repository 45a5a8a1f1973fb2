"""Bearer tokens on each request: authenticate (core.services.auth), check the scope the method needs, rate-limit.

GET/HEAD need ``read``; every other method needs ``write``. Admin powers additionally need the ``admin`` scope,
which the services check through ``Principal.is_admin``. The rate limit is per user, so minting tokens does not
multiply it; failed authentications are limited per client address (``api.ratelimit.FailedAuthentications``).
"""

from __future__ import annotations

import math

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session

from api.ratelimit import FailedAuthentications, Limiter
from core.services.auth import authenticate
from core.services.errors import Forbidden, Unauthenticated
from core.services.principal import Principal

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def bearer_secret(request: Request, *, allow_query_token: bool = False) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() == "bearer" and secret.strip():
        return secret.strip()
    # EventSource (the dashboard's SSE) cannot send headers; only stream endpoints accept the query form.
    query_token = request.query_params.get("access_token", "") if allow_query_token else ""
    if query_token:
        return query_token
    raise Unauthenticated("missing 'Authorization: Bearer <token>' header")


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def principal_for(
    request: Request, db: Session, *, allow_query_token: bool = False, scope: str | None = None
) -> Principal:
    """The caller, authenticated, with the scope the request needs: ``scope`` when given (an admin's token
    passes too), else ``read`` for reads and ``write`` for the rest; rate-limited per user."""
    secret = bearer_secret(request, allow_query_token=allow_query_token)
    failures: FailedAuthentications = request.app.state.auth_failures
    address = client_address(request)
    wait = failures.blocked_for(address)
    if wait > 0:
        raise _too_many(wait, "too many failed authentications from this address")
    try:
        principal = authenticate(db=db, secret=secret)
    except Unauthenticated:
        wait = failures.failed(address)
        if wait > 0:
            raise _too_many(wait, "too many failed authentications from this address") from None
        raise
    needed = scope or ("read" if request.method in READ_METHODS else "write")
    if needed not in principal.scopes and not (scope is not None and principal.is_admin):
        raise Forbidden(f"this token lacks the {needed!r} scope")
    limiter: Limiter = request.app.state.limiter
    wait = limiter.take(f"user:{principal.user_id}")
    if wait > 0:
        raise _too_many(wait, "rate limit exceeded for this user")
    request.state.principal = principal
    return principal


def _too_many(wait: float, detail: str) -> HTTPException:
    return HTTPException(429, detail, headers={"Retry-After": str(math.ceil(wait))})
