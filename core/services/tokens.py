"""API tokens: issued (the secret shown once), listed, revoked; every issue and revocation is audited."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import ApiToken
from core.repositories import users as users_repo
from core.security import new_token
from core.services.errors import Forbidden, InvalidInput, NotFound
from core.services.principal import SCOPES, Principal
from core.states import record_event


def issue(
    *,
    db: Session,
    principal: Principal,
    name: str,
    scopes: Sequence[str] = ("read", "write"),
    expires_at: datetime | None = None,
    user: str | None = None,
) -> tuple[ApiToken, str]:
    """A new token for the caller, or (admins only) for ``user``; returns (row, secret)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise InvalidInput.at("scopes", f"unknown scopes {unknown}; known: {list(SCOPES)}")
    if not scopes:
        raise InvalidInput.at("scopes", "at least one scope")
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidInput.at("expires_at", "must be in the future")
    owner_id = principal.user_id
    if user is not None and user != principal.name:
        if not principal.is_admin:
            raise Forbidden("only admins issue tokens for other users")
        owner = users_repo.get_by_name(db, user)
        if owner is None:
            raise NotFound(f"user {user!r} not found")
        owner_id = owner.id
        owner_is_admin = owner.is_admin
    else:
        owner_is_admin = principal.user_is_admin
    if "admin" in scopes and not (principal.is_admin and owner_is_admin):
        raise Forbidden("the 'admin' scope is issued only by an admin, to an admin")
    secret, prefix, digest = new_token()
    token = ApiToken(
        user_id=owner_id, name=name, prefix=prefix, token_hash=digest, scopes=sorted(set(scopes)), expires_at=expires_at
    )
    db.add(token)
    db.flush()
    record_event(
        db, "TOKEN_ISSUED", actor_user_id=principal.user_id, message=f"token {token.id} ({name}) issued",
        data={"token_id": token.id, "user_id": owner_id, "scopes": token.scopes},
    )  # fmt: skip
    return token, secret


def list_tokens(*, db: Session, principal: Principal, user: str | None = None) -> Sequence[ApiToken]:
    if user is None or user == principal.name:
        return users_repo.list_tokens(db, principal.user_id)
    if not principal.is_admin:
        raise Forbidden("only admins list other users' tokens")
    owner = users_repo.get_by_name(db, user)
    if owner is None:
        raise NotFound(f"user {user!r} not found")
    return users_repo.list_tokens(db, owner.id)


def revoke(*, db: Session, principal: Principal, token_id: int) -> ApiToken:
    token = users_repo.get_token(db, token_id)
    if token is None or (token.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"token {token_id} not found")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        record_event(
            db, "TOKEN_REVOKED", actor_user_id=principal.user_id, message=f"token {token.id} ({token.name}) revoked",
            data={"token_id": token.id, "user_id": token.user_id},
        )  # fmt: skip
    return token
