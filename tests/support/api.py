"""Shared API test helpers: an app bound to a given session, and a small world of teams, roles and tokens.

Integration tests (PostgreSQL) bind the app to the rolled-back ``db`` session; unit tests bind it to a migrated
SQLite file. Either way the app's own ``get_db`` is replaced by one that yields that session and mimics the
request's unit of work (commit on success, rollback on error), which under the ``db`` fixture are savepoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.app import create_app
from api.deps import SessionFactory, get_db, get_session_factory
from core.db import make_engine
from core.migrate import upgrade
from core.models import Membership, Team, User
from core.services import teams as teams_svc
from core.services import tokens as tokens_svc
from core.services.bootstrap import bootstrap_admin
from core.services.principal import Principal
from core.settings import Settings

SPEC: dict[str, Any] = {
    "name": "tiny",
    "team": "alpha",
    "recipe": {"name": "gpt", "hyperparameters": {"size": "tiny"}},
    "steps": 10,
    "resources": {"gpus": 0, "cpu_slots": 1},
}


def spec(**overrides: Any) -> dict[str, Any]:
    return {**SPEC, **overrides}


def bind_app(app: FastAPI, session: Session) -> FastAPI:
    """Make every request of ``app`` use ``session`` (the caller owns its transaction)."""

    def _get_db() -> Iterator[Session]:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise

    def _factory() -> SessionFactory:
        def read_session() -> AbstractContextManager[Session]:
            return nullcontext(session)

        return read_session

    app.dependency_overrides[get_db] = _get_db
    app.dependency_overrides[get_session_factory] = _factory
    return app


@contextmanager
def migrated_sqlite(directory: Path) -> Iterator[Engine]:
    """The embedded default database: ``kiln.db`` in ``directory``, migrated to the head revision; an engine on it."""
    url = f"sqlite:///{directory / 'kiln.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def make_app(engine: Engine, home: Path, session: Session | None = None, **settings: Any) -> FastAPI:
    app = create_app(Settings(home=home, **settings), engine=engine)
    return bind_app(app, session) if session is not None else app


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@dataclass
class World:
    """admin; teams alpha and beta; in alpha a team-admin, a member, a viewer; in beta a member; a job in each."""

    tokens: dict[str, str] = field(default_factory=dict)  # role -> secret
    users: dict[str, User] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # team -> a job id

    def h(self, role: str) -> dict[str, str]:
        return auth(self.tokens[role])


ROLES = ("admin", "team-admin", "member", "viewer")


def build_world(db: Session, client: TestClient) -> World:
    world = World()
    admin, secret = bootstrap_admin(db=db, name="root")
    world.users["admin"], world.tokens["admin"] = admin, secret
    root = Principal(user_id=admin.id, name="root", user_is_admin=True, scopes=frozenset({"read", "write", "admin"}))
    for team in ("alpha", "beta"):
        teams_svc.create_team(db=db, principal=root, name=team, quotas=[teams_svc.Quota("cpu", 4)])
    db.flush()
    alpha = teams_svc.get_team(db=db, principal=root, name="alpha")
    beta = teams_svc.get_team(db=db, principal=root, name="beta")
    placements: tuple[tuple[str, Team, str], ...] = (
        ("team-admin", alpha, "alice"),
        ("member", alpha, "mark"),
        ("viewer", alpha, "vera"),
        ("beta-member", beta, "bob"),
    )
    for role, team_row, user_name in placements:
        user = User(name=user_name)
        db.add(user)
        db.flush()
        db.add(Membership(user_id=user.id, team_id=team_row.id, role=role.removeprefix("beta-")))
        who = Principal(user_id=user.id, name=user_name)
        _, world.tokens[role] = tokens_svc.issue(db=db, principal=who, name="test")
        world.users[role] = user
    db.flush()
    db.expire_all()
    for team, role in (("alpha", "member"), ("beta", "beta-member")):
        r = client.post("/v1/jobs", json=spec(team=team, name=f"{team}-job"), headers=world.h(role))
        assert r.status_code == 201, r.text
        world.jobs[team] = r.json()["id"]
    return world


@pytest.fixture
def api_app(db: Session, pg_engine: Engine, tmp_path: Path) -> FastAPI:
    return make_app(pg_engine, tmp_path, db)


@pytest.fixture
def client(api_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(api_app) as c:
        yield c


@pytest.fixture
def world(db: Session, client: TestClient) -> World:
    return build_world(db, client)
