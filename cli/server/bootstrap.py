"""The first admin, straight through the database (``kiln admin bootstrap`` and ``kiln up``).

This is the one place the CLI opens a database session; it is the unit of work, so it commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class BootstrapError(Exception):
    def __init__(self, message: str, *, conflict: bool = False):
        super().__init__(message)
        self.conflict = conflict  # an admin exists already


@dataclass(frozen=True)
class BootstrapResult:
    user: str
    token: str


@contextmanager
def _session(url: str) -> Iterator[Session]:
    from sqlalchemy.exc import OperationalError, ProgrammingError
    from sqlalchemy.orm import Session

    from core.db import make_engine

    engine = make_engine(url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except (OperationalError, ProgrammingError) as exc:
                session.rollback()
                text = str(exc.orig) if exc.orig is not None else str(exc)
                if "no such table" in text or "does not exist" in text:
                    first = text.splitlines()[0]
                    raise BootstrapError(f"the database is not migrated ({first}): run `kiln migrate`") from None
                raise BootstrapError(f"database error: {text.splitlines()[0]}") from None
    finally:
        engine.dispose()


def bootstrap(url: str, *, name: str, force: bool = False) -> BootstrapResult:
    """Create the first admin (plus the ``default`` team and a token); refuse when an admin exists unless force."""
    from core.services.bootstrap import bootstrap_admin
    from core.services.errors import Conflict, ServiceError

    with _session(url) as db:
        try:
            user, secret = bootstrap_admin(db=db, name=name, force=force)
        except Conflict as exc:
            raise BootstrapError(exc.detail, conflict=True) from None
        except ServiceError as exc:
            raise BootstrapError(exc.detail) from None
        return BootstrapResult(user=user.name, token=secret)


def existing_admin(url: str) -> str | None:
    from core.repositories import users as users_repo

    with _session(url) as db:
        user = users_repo.any_admin(db)
        return user.name if user is not None else None


def token_owner(url: str, token: str) -> str | None:
    """The user whose live (known, not revoked, not expired) token this is in this database; None otherwise."""
    from core.services.auth import authenticate
    from core.services.errors import Unauthenticated

    with _session(url) as db:
        try:
            return authenticate(db=db, secret=token).name
        except Unauthenticated:
            return None


def give_default_team_gpus(url: str, gpus_by_type: dict[str, int]) -> list[str]:
    from core.services.bootstrap import give_default_team_gpus as give

    with _session(url) as db:
        return give(db=db, gpus_by_type=gpus_by_type)
