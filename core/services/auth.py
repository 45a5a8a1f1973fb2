"""Bearer-token authentication: hash lookup, expiry, revocation, scopes; last use recorded (coarsely). Stream
tickets: what a browser's EventSource (which cannot send headers) puts in a stream's URL instead of a token."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from core.db import utcnow
from core.repositories import users as users_repo
from core.security import hash_token
from core.services.errors import Unauthenticated
from core.services.principal import Principal

# Writing last_used_at on every request would turn every read into a write; a minute's precision is plenty.
LAST_USED_PRECISION = timedelta(seconds=60)


def authenticate(*, db: Session, secret: str, now: datetime | None = None) -> Principal:
    now = now or utcnow()
    ident = users_repo.identity_by_token_hash(db, hash_token(secret))
    if ident is None:
        raise Unauthenticated("unknown API token")
    return _principal(db, ident, now)


def recheck(*, db: Session, principal: Principal, now: datetime | None = None) -> Principal:
    """The caller as the database has it now (an open stream asks again): Unauthenticated when its token was
    revoked, expired or deleted since; otherwise with the memberships it has now."""
    if principal.token_id is None:
        return principal
    ident = users_repo.identity_by_token_id(db, principal.token_id)
    if ident is None:
        raise Unauthenticated("this API token no longer exists")
    return _principal(db, ident, now or utcnow(), touch=False)


def _principal(db: Session, ident: users_repo.TokenIdentity, now: datetime, *, touch: bool = True) -> Principal:
    if ident.revoked_at is not None:
        raise Unauthenticated("this API token was revoked")
    if ident.expires_at is not None and ident.expires_at <= now:
        raise Unauthenticated("this API token has expired")
    if touch and (ident.last_used_at is None or now - ident.last_used_at >= LAST_USED_PRECISION):
        users_repo.touch_token(db, ident.token_id, now)
    return Principal(
        user_id=ident.user_id,
        name=ident.user_name,
        user_is_admin=ident.user_is_admin,
        scopes=frozenset(str(s) for s in ident.scopes),
        token_id=ident.token_id,
        roles=ident.roles,
        token_expires_at=ident.expires_at,
    )


# A stream ticket: "kst_" + base64url(JSON {t: token id, p: path, e: expiry}) + "." + HMAC-SHA256 of that part,
# keyed by the minting token's stored hash (only the database and the token's holder can make one; no shared
# secret to configure, and every API process can check it). It opens one stream path, within TICKET_TTL, and
# is worth no more than the token that minted it: the token is checked again when the stream opens and while
# it runs. A token never appears in a URL, so no access log ever holds one; a ticket in a log is soon useless.
TICKET_PREFIX = "kst_"
TICKET_TTL = timedelta(seconds=60)


def issue_ticket(*, db: Session, principal: Principal, path: str, now: datetime | None = None) -> tuple[str, datetime]:
    if principal.token_id is None:
        raise Unauthenticated("stream tickets are minted with an API token")
    key = users_repo.token_hash_of(db, principal.token_id)
    if key is None:
        raise Unauthenticated("this API token no longer exists")
    expires = (now or utcnow()) + TICKET_TTL
    body = _b64(json.dumps({"t": principal.token_id, "p": path, "e": int(expires.timestamp())}).encode())
    return f"{TICKET_PREFIX}{body}.{_sign(key, body)}", expires


def authenticate_ticket(*, db: Session, ticket: str, path: str, now: datetime | None = None) -> Principal:
    """The caller behind a ticket for ``path``; Unauthenticated for a ticket that is malformed, forged, for
    another path, expired, or whose token is no longer valid."""
    now = now or utcnow()
    try:
        body, _, signature = ticket.removeprefix(TICKET_PREFIX).partition(".")
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        token_id, ticket_path, expires = int(claims["t"]), str(claims["p"]), int(claims["e"])
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise Unauthenticated("not a stream ticket") from exc
    key = users_repo.token_hash_of(db, token_id) if 0 < token_id < 2**63 else None
    if key is None or not ticket.startswith(TICKET_PREFIX) or not hmac.compare_digest(_sign(key, body), signature):
        raise Unauthenticated("not a stream ticket")
    if ticket_path != path:
        raise Unauthenticated("this stream ticket is for another stream")
    if expires <= now.timestamp():
        raise Unauthenticated("this stream ticket has expired; get a new one (POST /v1/stream-tickets)")
    ident = users_repo.identity_by_token_id(db, token_id)
    if ident is None:
        raise Unauthenticated("not a stream ticket")
    return _principal(db, ident, now)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _sign(key: str, body: str) -> str:
    return _b64(hmac.new(key.encode(), f"kiln-stream-ticket:{body}".encode(), hashlib.sha256).digest())
