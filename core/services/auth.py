"""Bearer-token authentication: hash lookup, expiry, revocation, scopes; last use recorded (coarsely)."""

from __future__ import annotations

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
    if ident.revoked_at is not None:
        raise Unauthenticated("this API token was revoked")
    if ident.expires_at is not None and ident.expires_at <= now:
        raise Unauthenticated("this API token has expired")
    if ident.last_used_at is None or now - ident.last_used_at >= LAST_USED_PRECISION:
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
