"""Users: the caller itself, and admin-only creation and listing."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from core.models import User
from core.repositories import users as users_repo
from core.repositories.keyset import Window
from core.services.errors import Conflict, NotFound
from core.services.principal import Principal, require_admin


def me(*, db: Session, principal: Principal) -> User:
    user = users_repo.get_by_id(db, principal.user_id)
    if user is None:  # deleted while the request ran
        raise NotFound("user not found")
    return user


def list_users(*, db: Session, principal: Principal, window: Window | None = None) -> Sequence[User]:
    require_admin(principal, "listing users")
    return users_repo.list_users(db, window)


def create_user(
    *, db: Session, principal: Principal, name: str, email: str | None = None, is_admin: bool = False
) -> User:
    require_admin(principal, "creating a user")
    if users_repo.get_by_name(db, name) is not None:
        raise Conflict(f"user {name!r} already exists")
    user = User(name=name, email=email, is_admin=is_admin)
    db.add(user)
    db.flush()
    return user
