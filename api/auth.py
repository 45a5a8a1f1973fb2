"""Bearer tokens on each request: authenticate (core.services.auth), check the scope the method needs, rate-limit.

GET/HEAD need ``read``; every other method needs ``write``. Admin powers additionally need the ``admin`` scope,
which the services check through ``Principal.is_admin``. The rate limit is per user, so minting tokens does not
multiply it; failed authentications are limited per client address (``api.ratelimit.FailedAuthentications``), and
only they: a valid token is never refused for its address's failures.

A token is never accepted in a URL (access logs keep URLs). A stream endpoint, which a browser's EventSource
opens without headers, also takes a short-lived stream ticket for its own path as ``?ticket=``.
"""

from __future__ import annotations

import math

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session

from api.ratelimit import FailedAuthentications, Limiter
from core.services.auth import authenticate, authenticate_ticket
from core.services.errors import Forbidden, Unauthenticated
from core.services.principal import Principal

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def bearer_secret(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() == "bearer" and secret.strip():
        return secret.strip()
    return None


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def principal_for(request: Request, db: Session, *, stream: bool = False, scope: str | None = None) -> Principal:
    """The caller, authenticated, with the scope the request needs: ``scope`` when given (an admin's token
    passes too), else ``read`` for reads and ``write`` for the rest; rate-limited per user. ``stream``: the
    route is a stream, which also takes a ticket (``?ticket=``) for its own path."""
    secret = bearer_secret(request)
    ticket = request.query_params.get("ticket") if stream and secret is None else None
    if secret is None and not ticket:
        if request.query_params.get("access_token"):
            raise Unauthenticated(
                "a token is never accepted in a URL; send 'Authorization: Bearer <token>'"
                + (" or a stream ticket (POST /v1/stream-tickets) as ?ticket=" if stream else "")
            )
        raise Unauthenticated("missing 'Authorization: Bearer <token>' header")
    # The token is looked up first, whatever the address did: the failed-authentication limit refuses failures
    # only, so a guesser behind the same NAT or proxy never locks the address's valid users out. A lookup is one
    # indexed read of the secret's SHA-256 (a ticket's HMAC: the same read), and a token is 256 random bits, so
    # looking each one up opens no brute force; a bad one from an address past its limit is refused with 429, and
    # costs no call to the shared bucket (the note in this process).
    try:
        if secret is not None:
            principal = authenticate(db=db, secret=secret)
        else:
            principal = authenticate_ticket(db=db, ticket=str(ticket), path=request.url.path)
    except Unauthenticated:
        failures: FailedAuthentications = request.app.state.auth_failures
        address = client_address(request)
        wait = failures.blocked_for(address) or failures.failed(address)
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
