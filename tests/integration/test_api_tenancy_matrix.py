"""Every role x every endpoint x own team / other team, with the expected status code.

Roles: admin (global), and in team ``alpha`` a team-admin, a member and a viewer. "own" targets alpha (for the
admin too), "other" targets beta, which none of the team roles belongs to: it must answer 404, never 403, so a
team's existence does not leak. Each row runs against a freshly built world in a rolled-back transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Membership, Team, User
from tests.support.api import ROLES, World, spec

pytestmark = pytest.mark.integration

A, TA, M, V = ROLES  # admin, team-admin, member, viewer


@dataclass(frozen=True)
class Case:
    method: str
    path: str  # {team} and {job} are filled in with the target team and its job
    own: dict[str, int]  # role -> status, targeting the role's own team (alpha)
    other: dict[str, int] | None  # targeting beta; None for endpoints that are not team-scoped
    body: Callable[[str], Any] | None = None


def same(code: int) -> dict[str, int]:
    return dict.fromkeys(ROLES, code)


def admin_only(ok: int, denied: int) -> dict[str, int]:
    return {A: ok, TA: denied, M: denied, V: denied}


def team_admin_up(ok: int) -> dict[str, int]:
    return {A: ok, TA: ok, M: 403, V: 403}


def member_up(ok: int) -> dict[str, int]:
    return {A: ok, TA: ok, M: ok, V: 403}


def hidden(admin_code: int) -> dict[str, int]:
    return {A: admin_code, TA: 404, M: 404, V: 404}


CASES: dict[str, Case] = {
    # teams
    "get team": Case("GET", "/v1/teams/{team}", same(200), hidden(200)),
    "patch team": Case(
        "PATCH", "/v1/teams/{team}", admin_only(200, 403), hidden(200), lambda t: {"fair_share_weight": 2}
    ),
    "delete team (has jobs)": Case("DELETE", "/v1/teams/{team}", admin_only(409, 403), hidden(409)),
    "list members": Case("GET", "/v1/teams/{team}/members", same(200), hidden(200)),
    "add member": Case(  # an admin adds; a team-admin invites (the user joins by accepting)
        "PUT",
        "/v1/teams/{team}/members/newbie",
        {A: 201, TA: 202, M: 403, V: 403},
        hidden(201),
        lambda t: {"role": "viewer"},
    ),
    "list invitations": Case("GET", "/v1/teams/{team}/invitations", team_admin_up(200), hidden(200)),
    "change role": Case(
        "PUT", "/v1/teams/{team}/members/zed", team_admin_up(200), hidden(200), lambda t: {"role": "viewer"}
    ),
    "remove member": Case("DELETE", "/v1/teams/{team}/members/zed", team_admin_up(204), hidden(204)),
    "get team sla": Case("GET", "/v1/teams/{team}/sla", same(200), hidden(200)),
    "put team sla": Case("PUT", "/v1/teams/{team}/sla", team_admin_up(200), hidden(200), lambda t: {"qos": "bronze"}),
    # jobs
    "submit": Case("POST", "/v1/jobs", member_up(201), hidden(201), lambda t: spec(team=t, name="m")),
    "list jobs of team": Case("GET", "/v1/jobs?team={team}", same(200), hidden(200)),
    "get job": Case("GET", "/v1/jobs/{job}", same(200), hidden(200)),
    "cancel job": Case("POST", "/v1/jobs/{job}/cancel", member_up(202), hidden(202)),
    "hold job": Case("POST", "/v1/jobs/{job}/hold", member_up(200), hidden(200)),
    "release job": Case("POST", "/v1/jobs/{job}/release", member_up(200), hidden(200)),
    "change job": Case("PATCH", "/v1/jobs/{job}", member_up(200), hidden(200), lambda t: {"time_limit_s": 3600}),
    "job events": Case("GET", "/v1/jobs/{job}/events", same(200), hidden(200)),
    "job logs": Case("GET", "/v1/jobs/{job}/logs", same(200), hidden(200)),
    "job metrics": Case("GET", "/v1/jobs/{job}/metrics", same(200), hidden(200)),
    "job attempts": Case("GET", "/v1/jobs/{job}/attempts", same(200), hidden(200)),
    "job checkpoints": Case("GET", "/v1/jobs/{job}/checkpoints", same(200), hidden(200)),
    "job why": Case("GET", "/v1/jobs/{job}/why", same(200), hidden(200)),
    "job sla": Case("GET", "/v1/jobs/{job}/sla", same(200), hidden(200)),
    "usage of team": Case("GET", "/v1/usage?team={team}", same(200), hidden(200)),
    # global
    "list jobs": Case("GET", "/v1/jobs", same(200), None),
    "list teams": Case("GET", "/v1/teams", same(200), None),
    "create team": Case("POST", "/v1/teams", admin_only(201, 403), None, lambda t: {"name": "gamma"}),
    "me": Case("GET", "/v1/me", same(200), None),
    "list users": Case("GET", "/v1/users", admin_only(200, 403), None),
    "create user": Case("POST", "/v1/users", admin_only(201, 403), None, lambda t: {"name": "carol"}),
    "issue own token": Case("POST", "/v1/tokens", same(201), None, lambda t: {"name": "t"}),
    "issue token for another": Case(
        "POST", "/v1/tokens", admin_only(201, 403), None, lambda t: {"name": "t", "user": "zed"}
    ),
    "list own tokens": Case("GET", "/v1/tokens", same(200), None),
    "list another's tokens": Case("GET", "/v1/tokens?user=zed", admin_only(200, 403), None),
    "list qos": Case("GET", "/v1/qos", same(200), None),
    "get qos": Case("GET", "/v1/qos/gold", same(200), None),
    "patch qos": Case("PATCH", "/v1/qos/gold", admin_only(200, 403), None, lambda t: {"priority": 1001}),
    "hosts": Case("GET", "/v1/cluster/hosts", same(200), None),
    "gpus": Case("GET", "/v1/cluster/gpus", same(200), None),
    "usage": Case("GET", "/v1/usage", same(200), None),
}

PARAMS = [
    pytest.param(name, role, target, id=f"{name}|{role}|{target}")
    for name, case in CASES.items()
    for target in (("own", "other") if case.other is not None else ("global",))
    for role in ROLES
]


def _add_zed(db: Session) -> None:
    """A user in both teams, for membership changes and tokens issued on someone's behalf."""

    zed = User(name="zed")
    newbie = User(name="newbie")
    db.add_all([zed, newbie])
    db.flush()
    for team in db.scalars(select(Team).where(Team.name.in_(["alpha", "beta"]))):
        db.add(Membership(user_id=zed.id, team_id=team.id, role="member"))
    db.flush()


@pytest.mark.parametrize(("name", "role", "target"), PARAMS)
def test_matrix(name: str, role: str, target: str, client: TestClient, world: World, db: Session) -> None:
    _add_zed(db)
    case = CASES[name]
    team = "beta" if target == "other" else "alpha"
    expected = case.other if target == "other" else case.own
    assert expected is not None
    path = case.path.format(team=team, job=world.jobs[team])
    body = case.body(team) if case.body else None
    r = client.request(case.method, path, json=body, headers=world.h(role))
    assert r.status_code == expected[role], f"{case.method} {path} as {role}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/problem+json"
