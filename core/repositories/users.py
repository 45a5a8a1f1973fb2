"""Users and API tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from core.models import ApiToken, Membership, User
from core.repositories.keyset import Window, page


def get_by_name(db: Session, name: str) -> User | None:
    return db.scalars(select(User).where(User.name == name)).one_or_none()


def get_by_id(db: Session, user_id: int) -> User | None:
    return db.get(User, user_id)


def list_users(db: Session, window: Window | None = None) -> Sequence[User]:
    return db.scalars(page(select(User), [(User.name, False)], window)).all()


def any_admin(db: Session) -> User | None:
    return db.scalars(select(User).where(User.is_admin.is_(True)).order_by(User.id).limit(1)).first()


def roles_of(db: Session, user_id: int) -> dict[int, str]:
    """The user's role in each team it is a member of: {team id: role}."""
    rows = db.execute(select(Membership.team_id, Membership.role).where(Membership.user_id == user_id)).all()
    return {team_id: role for team_id, role in rows}


def names_by_id(db: Session, user_ids: Sequence[int | None]) -> dict[int, str]:
    wanted = {u for u in user_ids if u is not None}
    if not wanted:
        return {}
    return dict(db.execute(select(User.id, User.name).where(User.id.in_(wanted))).tuples().all())


@dataclass(frozen=True)
class TokenIdentity:
    token_id: int
    scopes: list[Any]
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    user_id: int
    user_name: str
    user_is_admin: bool
    roles: dict[int, str]  # team_id -> role


# The same query as plain SQL for PostgreSQL, run with ``exec_driver_sql``: no statement construction, cache key or
# compilation per request (it runs on every request), and psycopg prepares it server-side after a few runs.
_IDENTITY_PG = (
    "SELECT api_tokens.id, api_tokens.scopes, api_tokens.expires_at, api_tokens.revoked_at,"
    " api_tokens.last_used_at, users.id, users.name, users.is_admin, memberships.team_id, memberships.role"
    " FROM api_tokens JOIN users ON users.id = api_tokens.user_id"
    " LEFT OUTER JOIN memberships ON memberships.user_id = users.id"
    " WHERE api_tokens.token_hash = %(token_hash)s"
)


def identity_by_token_hash(db: Session, token_hash: str) -> TokenIdentity | None:
    """What authentication needs, memberships included, in one query of plain columns (it runs on every
    request): one row per membership, or one row with NULL team for a user in no team."""
    conn = db.connection()
    if conn.dialect.name == "postgresql":
        # timestamptz arrives aware (in the session's zone): only compared with now, never serialized
        rows: Sequence[Any] = conn.exec_driver_sql(_IDENTITY_PG, {"token_hash": token_hash}).all()
    else:
        rows = conn.execute(_identity_select().where(ApiToken.token_hash == token_hash)).all()
    return _identity(rows)


def identity_by_token_id(db: Session, token_id: int) -> TokenIdentity | None:
    """The same, by the token's id: an open stream re-reading its caller's token and memberships."""
    return _identity(db.connection().execute(_identity_select().where(ApiToken.id == token_id)).all())


def token_hash_of(db: Session, token_id: int) -> str | None:
    return db.scalar(select(ApiToken.token_hash).where(ApiToken.id == token_id))


def _identity_select() -> Any:
    return (
        select(
            ApiToken.id,
            ApiToken.scopes,
            ApiToken.expires_at,
            ApiToken.revoked_at,
            ApiToken.last_used_at,
            User.id,
            User.name,
            User.is_admin,
            Membership.team_id,
            Membership.role,
        )
        .join(User, User.id == ApiToken.user_id)
        .outerjoin(Membership, Membership.user_id == User.id)
    )


def _identity(rows: Sequence[Any]) -> TokenIdentity | None:
    if not rows:
        return None
    token_id, scopes, expires_at, revoked_at, last_used_at, user_id, name, is_admin, _, _ = rows[0]
    return TokenIdentity(
        token_id=token_id,
        scopes=scopes,
        expires_at=expires_at,
        revoked_at=revoked_at,
        last_used_at=last_used_at,
        user_id=user_id,
        user_name=name,
        user_is_admin=is_admin,
        roles={r[8]: r[9] for r in rows if r[8] is not None},
    )


def touch_token(db: Session, token_id: int, when: datetime) -> None:
    db.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=when))


def get_token(db: Session, token_id: int) -> ApiToken | None:
    return db.get(ApiToken, token_id)


def lock_token(db: Session, token_id: int) -> Any:
    """The token's ``revoked_at`` and ``expires_at`` as committed now, its row held against a revocation until the
    transaction ends (``FOR SHARE``: minting from it waits for a revocation in progress, then sees it; a revocation
    waits for the mint, then revokes its child). None when it is gone."""
    stmt = select(ApiToken.revoked_at, ApiToken.expires_at).where(ApiToken.id == token_id).with_for_update(read=True)
    return db.execute(stmt).first()


def revoke_tree(db: Session, token_id: int, now: datetime) -> list[tuple[int, int, str]]:
    """Revoke the token and every token minted from it, at any depth; returns (id, user id, name) of those revoked
    now. Each statement reads the tree as committed when it starts, so it is repeated until it revokes nothing: a
    token minted from one of them while the first ran (its mint held the parent's row, and the update waited for
    it) is revoked by the next. A mint that comes later waits for this transaction and finds its parent revoked."""
    done: list[tuple[int, int, str]] = []
    while True:
        tree = select(ApiToken.id).where(ApiToken.id == token_id).cte("tree", recursive=True)
        tree = tree.union_all(select(ApiToken.id).where(ApiToken.parent_id == tree.c.id))
        stmt = (
            update(ApiToken)
            .where(ApiToken.id.in_(select(tree.c.id)), ApiToken.revoked_at.is_(None))
            .values(revoked_at=now)
            .returning(ApiToken.id, ApiToken.user_id, ApiToken.name)
            .execution_options(synchronize_session=False)
        )
        rows = [(int(i), int(u), str(n)) for i, u, n in db.execute(stmt).all()]
        if not rows:
            return done
        done += rows


def count_active_tokens(db: Session, user_id: int, now: datetime) -> int:
    return int(
        db.scalar(
            select(func.count(ApiToken.id)).where(
                ApiToken.user_id == user_id,
                ApiToken.revoked_at.is_(None),
                or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now),
            )
        )
        or 0
    )


def list_tokens(db: Session, user_id: int | None, window: Window | None = None) -> Sequence[ApiToken]:
    stmt = select(ApiToken)
    if user_id is not None:
        stmt = stmt.where(ApiToken.user_id == user_id)
    return db.scalars(page(stmt, [(ApiToken.id, False)], window)).all()
