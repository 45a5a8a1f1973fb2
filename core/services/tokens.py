"""API tokens: issued (the secret shown once), listed, revoked; every issue and revocation is audited.

A token minted with a token remembers it (``parent_id``): revoking a token revokes every token minted from it, at
any depth, whoever owns them (an admin's token takes the tokens it minted for other users with it), so a leaked
token leaves no working child behind once it is revoked."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from core.db import utcnow
from core.event_types import EventType
from core.models import ApiToken
from core.repositories import users as users_repo
from core.repositories.keyset import Window
from core.security import new_token
from core.services.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated
from core.services.principal import SCOPES, Principal
from core.transitions import record_event

ORDINARY_SCOPES = frozenset({"read", "write"})


def issue(
    *,
    db: Session,
    principal: Principal,
    name: str,
    scopes: Sequence[str] | None = None,
    expires_at: datetime | None = None,
    user: str | None = None,
    max_active: int | None = None,
) -> tuple[ApiToken, str]:
    """A new token for the caller, or (admins only) for ``user``; returns (row, secret). ``max_active``: the most
    live tokens the owner may hold (the API passes ``KILN_MAX_TOKENS_PER_USER``; None: no cap).

    A minted token never exceeds the one that mints it: its scopes are a subset of the caller's (default: the
    caller's ``read``/``write``), and it expires no later (default: when the caller's token does)."""
    scopes = _scopes(principal, scopes)
    expires_at = _expiry(principal, expires_at)
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
    active = users_repo.count_active_tokens(db, owner_id, utcnow()) if max_active is not None else 0
    if max_active is not None and active >= max_active:
        raise Conflict(f"{user or principal.name} has {active} live tokens, the most allowed; revoke one first")
    if principal.token_id is not None:
        _hold_live_parent(db, principal.token_id)
    secret, prefix, digest = new_token()
    token = ApiToken(
        user_id=owner_id,
        name=name,
        prefix=prefix,
        token_hash=digest,
        scopes=scopes,
        expires_at=expires_at,
        parent_id=principal.token_id,
    )
    db.add(token)
    db.flush()
    record_event(
        db,
        EventType.TOKEN_ISSUED,
        actor_user_id=principal.user_id,
        message=f"token {token.id} ({name}) issued",
        data={"token_id": token.id, "user_id": owner_id, "scopes": token.scopes, "parent_id": principal.token_id},
    )
    return token, secret


def _hold_live_parent(db: Session, token_id: int) -> None:
    """The minting token, held until the new token is committed (a revocation of it or of its ancestors waits, then
    revokes the new token too), and still live now: its revocation may have committed since the request
    authenticated."""
    parent = users_repo.lock_token(db, token_id)
    if parent is None or parent.revoked_at is not None:
        raise Unauthenticated("this API token was revoked")
    if parent.expires_at is not None and parent.expires_at <= utcnow():
        raise Unauthenticated("this API token has expired")


def _scopes(principal: Principal, wanted: Sequence[str] | None) -> list[str]:
    """The new token's scopes: within the caller's own (an admin may also grant ``metrics``)."""
    if wanted is None:
        wanted = sorted(principal.scopes & ORDINARY_SCOPES)
    unknown = sorted(set(wanted) - set(SCOPES))
    if unknown:
        raise InvalidInput.at("scopes", f"unknown scopes {unknown}; known: {list(SCOPES)}")
    if not wanted:
        raise InvalidInput.at("scopes", "at least one scope")
    grantable = set(principal.scopes) | ({"metrics"} if principal.is_admin else set())
    beyond = sorted(set(wanted) - grantable)
    if beyond:
        raise Forbidden(f"a token cannot grant scopes it lacks: this one has {sorted(principal.scopes)}, not {beyond}")
    return sorted(set(wanted))


def _expiry(principal: Principal, wanted: datetime | None) -> datetime | None:
    """The new token's expiry: in the future, and never after the calling token's own."""
    if wanted is not None and wanted <= utcnow():
        raise InvalidInput.at("expires_at", "must be in the future")
    ceiling = principal.token_expires_at
    if ceiling is None:
        return wanted
    if wanted is None:
        return ceiling
    if wanted > ceiling:
        raise InvalidInput.at(
            "expires_at", f"must not be later than the calling token's own expiry ({ceiling.isoformat()})"
        )
    return wanted


def list_tokens(
    *, db: Session, principal: Principal, user: str | None = None, window: Window | None = None
) -> Sequence[ApiToken]:
    if user is None or user == principal.name:
        return users_repo.list_tokens(db, principal.user_id, window)
    if not principal.is_admin:
        raise Forbidden("only admins list other users' tokens")
    owner = users_repo.get_by_name(db, user)
    if owner is None:
        raise NotFound(f"user {user!r} not found")
    return users_repo.list_tokens(db, owner.id, window)


def revoke(*, db: Session, principal: Principal, token_id: int) -> ApiToken:
    """Revoke the token and every token minted from it (transitively, whoever owns them); each one revoked now is
    audited. Revoking a revoked token again revokes what is still live below it."""
    token = users_repo.get_token(db, token_id)
    if token is None or (token.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"token {token_id} not found")
    for revoked_id, owner_id, name in users_repo.revoke_tree(db, token.id, utcnow()):
        why = "" if revoked_id == token.id else f" with token {token.id}, which it was minted from (directly or not)"
        record_event(
            db,
            EventType.TOKEN_REVOKED,
            actor_user_id=principal.user_id,
            message=f"token {revoked_id} ({name}) revoked{why}",
            data={"token_id": revoked_id, "user_id": owner_id, **({"with": token.id} if why else {})},
        )
    db.refresh(token)
    return token
