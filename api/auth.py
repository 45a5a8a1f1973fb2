"""Bearer tokens on each request: authenticate (core.services.auth), check the scope the method needs, rate-limit.

GET/HEAD need ``read``; every other method needs ``write``. Admin powers additionally need the ``admin`` scope,
which the services check through ``Principal.is_admin``.
"""

from __future__ import annotations

import math

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session

from api.ratelimit import Limiter
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


def principal_for(request: Request, db: Session, *, allow_query_token: bool = False) -> Principal:
    principal = authenticate(db=db, secret=bearer_secret(request, allow_query_token=allow_query_token))
    needed = "read" if request.method in READ_METHODS else "write"
    if needed not in principal.scopes:
        raise Forbidden(f"this token lacks the {needed!r} scope")
    limiter: Limiter = request.app.state.limiter
    wait = limiter.take(principal.token_id or 0)
    if wait > 0:
        raise HTTPException(429, "rate limit exceeded for this token", headers={"Retry-After": str(math.ceil(wait))})
    request.state.principal = principal
    return principal
