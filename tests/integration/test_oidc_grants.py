"""What a checked ID token makes of a kiln user (core.services.oidc_signin), on PostgreSQL: groups to teams, roles and
admin at each sign-in; only what sign-in granted is taken away; a local user's name is never taken over. (The ID
token checks themselves run against a real provider in tests/e2e/test_oidc_signin.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy.orm import Session

from core.models import Membership, Team, User
from core.services.errors import Conflict
from core.services.oidc_signin import grants_for, sign_in
from core.settings import OidcSettings, Settings

ISSUER = "https://sso.example.test"
MAP = {"ml-eng": "research:member", "ml-leads": "research:team-admin,vision:viewer", "ops": "admin"}


def settings() -> OidcSettings:
    return OidcSettings(oidc_issuer=ISSUER, oidc_client_id="kiln", oidc_group_map=MAP)


def claims(sub: str, groups: list[str], name: str | None = None) -> dict[str, Any]:
    return {"iss": ISSUER, "sub": sub, "preferred_username": name or sub, "groups": groups}


def teams(db: Session, user: User) -> dict[str, str]:
    db.refresh(user)
    return {m.team.name: m.role for m in user.memberships}


@pytest.fixture
def research(db: Session) -> Team:
    team = Team(name="research")
    db.add_all([team, Team(name="vision")])
    db.flush()
    return team


def test_the_highest_role_wins_and_unknown_groups_grant_nothing() -> None:
    grants = grants_for(settings(), ["ml-eng", "ml-leads", "elsewhere"])
    assert grants.teams == {"research": "team-admin", "vision": "viewer"} and not grants.admin
    assert grants_for(settings(), ["ops"]).admin


def test_a_misspelt_role_in_the_map_stops_the_process() -> None:
    with pytest.raises(ValidationError, match="neither 'admin' nor 'team:role'"):
        OidcSettings(oidc_group_map={"ml-eng": "research:memebr"})


def test_each_sign_in_sets_the_grants_and_a_removed_group_takes_its_team(db: Session, research: Team) -> None:
    token, _, user, _ = sign_in(
        db=db, settings=settings(), claims=claims("u1", ["ml-leads", "ops"]), max_active=None, client="cli"
    )
    assert teams(db, user) == {"research": "team-admin", "vision": "viewer"} and user.is_admin
    assert set(token.scopes) == {"read", "write", "admin"} and token.expires_at is not None
    _, _, again, _ = sign_in(db=db, settings=settings(), claims=claims("u1", ["ml-eng"]), max_active=None, client="cli")
    assert again.id == user.id
    assert teams(db, user) == {"research": "member"} and not user.is_admin


def test_a_membership_added_by_hand_is_not_the_providers_to_remove(db: Session, research: Team) -> None:
    _, _, user, _ = sign_in(db=db, settings=settings(), claims=claims("u2", []), max_active=None, client="cli")
    db.add(Membership(user_id=user.id, team_id=research.id, role="viewer"))
    db.flush()
    db.expire(user)
    sign_in(db=db, settings=settings(), claims=claims("u2", ["ml-leads"]), max_active=None, client="cli")
    sign_in(db=db, settings=settings(), claims=claims("u2", []), max_active=None, client="cli")
    assert teams(db, user) == {"research": "viewer"}


def test_a_local_users_name_is_not_taken_over(db: Session) -> None:
    db.add(User(name="root-admin", is_admin=True))
    db.flush()
    with pytest.raises(Conflict, match="does not sign in with"):
        sign_in(
            db=db, settings=settings(), claims=claims("x", ["ops"], name="root-admin"), max_active=None, client="cli"
        )


def test_sign_in_is_off_until_configured(client: TestClient) -> None:
    assert not Settings().oidc_enabled
    r = client.get("/v1/auth/oidc")
    assert r.status_code == 200 and r.json()["enabled"] is False, r.text  # the sign-in page asks at every load
    r = client.post("/v1/auth/oidc/id-token", json={"id_token": "x"})
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json"), r.text


def test_a_provider_that_cannot_be_reached_is_a_502_problem(db: Session, pg_engine: Any, tmp_path: Path) -> None:
    from harness.services import free_port
    from tests.support.api import make_app

    dead = f"http://127.0.0.1:{free_port()}"
    app = make_app(pg_engine, tmp_path, db, oidc_issuer=dead, oidc_client_id="kiln")
    with TestClient(app) as client:
        r = client.get("/v1/auth/oidc")
        assert r.status_code == 502 and r.headers["content-type"].startswith("application/problem+json"), r.text
        assert "discovery document" in r.json()["detail"]
        r = client.post("/v1/auth/oidc/id-token", json={"id_token": "x.y.z"})
        assert r.status_code == 502, r.text


def test_the_client_secret_may_come_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    assert OidcSettings(oidc_client_secret_file=tmp_path / "secret").oidc_client_secret == "s3cret"
