"""Joining a team takes the user's consent (or an admin's act), and inviting reveals no user names.

Before: a team-admin added any existing user to the team at once, and learnt which user names exist (404 for
a name nobody has, 201 for a real one)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import TeamInvitation
from tests.support.api import World

pytestmark = pytest.mark.integration


def test_a_team_admin_invites_and_only_the_user_makes_it_membership(client: TestClient, world: World) -> None:
    ta, bob = world.h("team-admin"), world.h("beta-member")
    alpha_job = f"/v1/jobs/{world.jobs['alpha']}"
    r = client.put("/v1/teams/alpha/members/bob", json={"role": "member"}, headers=ta)
    assert r.status_code == 202 and r.json()["status"] == "invited"
    assert client.get(alpha_job, headers=bob).status_code == 404  # not in the team until bob says so
    assert [i["team"] for i in client.get("/v1/me/invitations", headers=bob).json()["items"]] == ["alpha"]
    assert client.post("/v1/me/invitations/alpha/decline", headers=bob).status_code == 204
    assert client.get("/v1/me/invitations", headers=bob).json()["items"] == []
    assert client.post("/v1/me/invitations/alpha/accept", headers=bob).status_code == 404  # declined: gone

    assert client.put("/v1/teams/alpha/members/bob", json={"role": "viewer"}, headers=ta).status_code == 202
    r = client.post("/v1/me/invitations/alpha/accept", headers=bob)
    assert r.status_code == 201 and r.json()["role"] == "viewer"
    assert client.get(alpha_job, headers=bob).status_code == 200
    # Only a team-admin invites; another user's invitation is not yours to accept.
    by_member = client.put("/v1/teams/alpha/members/zoe", json={"role": "member"}, headers=world.h("member"))
    assert by_member.status_code == 403
    client.put("/v1/teams/alpha/members/zoe", json={"role": "member"}, headers=ta)
    assert client.post("/v1/me/invitations/alpha/accept", headers=world.h("viewer")).status_code == 404


def test_inviting_does_not_tell_which_user_names_exist(client: TestClient, world: World) -> None:
    ta = world.h("team-admin")
    real = client.put("/v1/teams/alpha/members/bob", json={"role": "member"}, headers=ta)
    ghost = client.put("/v1/teams/alpha/members/ghost", json={"role": "member"}, headers=ta)
    assert real.status_code == ghost.status_code == 202
    assert real.json().keys() == ghost.json().keys()
    assert {k: v for k, v in real.json().items() if k not in ("user", "created_at", "expires_at")} == {
        k: v for k, v in ghost.json().items() if k not in ("user", "created_at", "expires_at")
    }
    pending = {i["user"] for i in client.get("/v1/teams/alpha/invitations", headers=ta).json()["items"]}
    assert pending == {"bob", "ghost"}
    for name in ("bob", "ghost"):  # removing someone not in the team: one answer for both
        r = client.delete(f"/v1/teams/alpha/members/{name}", headers=ta)
        assert r.status_code == 404 and r.json()["detail"] == f"user {name!r} is not a member of team 'alpha'"


def test_an_invitation_lapses_and_an_admin_adds_directly(client: TestClient, world: World, db: Session) -> None:
    client.put("/v1/teams/alpha/members/bob", json={"role": "member"}, headers=world.h("team-admin"))
    db.execute(update(TeamInvitation).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert client.get("/v1/me/invitations", headers=world.h("beta-member")).json()["items"] == []
    assert client.post("/v1/me/invitations/alpha/accept", headers=world.h("beta-member")).status_code == 404
    r = client.put("/v1/teams/alpha/members/bob", json={"role": "member"}, headers=world.h("admin"))
    assert r.status_code == 201 and r.json()["status"] == "member"
