"""Which QoS classes, and how many restarts, a team may use is an admin's decision.

Before: a member submitted with ``gold``; a team-admin set the team's default to gold with 1,000 restarts."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from core.db import make_engine
from core.migrate import upgrade
from harness.services import temporary_database
from tests.support.api import World, spec

pytestmark = pytest.mark.integration


def test_a_member_cannot_take_a_class_the_team_was_not_granted(client: TestClient, world: World) -> None:
    r = client.post("/v1/jobs", json=spec(name="greedy", sla={"qos": "gold"}), headers=world.h("member"))
    assert r.status_code == 403 and "gold" in r.json()["detail"] and "silver" in r.json()["detail"]
    jobs = client.get("/v1/jobs", params={"name": "greedy"}, headers=world.h("admin")).json()["items"]
    assert jobs == []
    r = client.post("/v1/jobs", json=spec(name="modest", sla={"qos": "bronze"}), headers=world.h("member"))
    assert r.status_code == 201
    # An admin grants it; then it is the member's to use.
    r = client.patch("/v1/teams/alpha", json={"qos_classes": ["gold", "silver"]}, headers=world.h("admin"))
    assert r.status_code == 200 and r.json()["qos_classes"] == ["gold", "silver"]
    r = client.post("/v1/jobs", json=spec(name="granted", sla={"qos": "gold"}), headers=world.h("member"))
    assert r.status_code == 201 and r.json()["qos"] == "gold"


def test_a_team_admin_cannot_raise_the_team_default_beyond_its_grant(client: TestClient, world: World) -> None:
    ta = world.h("team-admin")
    assert client.put("/v1/teams/alpha/sla", json={"qos": "gold"}, headers=ta).status_code == 403
    r = client.put("/v1/teams/alpha/sla", json={"qos": "silver", "max_restarts": 1000}, headers=ta)
    assert r.status_code == 403 and "restart limit of 10" in r.json()["detail"]
    assert client.put("/v1/teams/alpha/sla", json={"qos": "silver", "max_restarts": 10}, headers=ta).status_code == 200
    # ... nor give the team more: the grant and the limit are the team's settings, which only admins change.
    assert client.patch("/v1/teams/alpha", json={"qos_classes": ["gold"]}, headers=ta).status_code == 403
    assert client.patch("/v1/teams/alpha", json={"restart_limit": 1000}, headers=ta).status_code == 403


def test_a_spec_cannot_ask_for_more_restarts_than_the_team_limit(client: TestClient, world: World) -> None:
    r = client.post("/v1/jobs", json=spec(name="stubborn", sla={"max_restarts": 1000}), headers=world.h("member"))
    assert r.status_code == 403
    assert client.patch("/v1/teams/alpha", json={"restart_limit": 20}, headers=world.h("admin")).status_code == 200
    r = client.post("/v1/jobs", json=spec(name="stubborn", sla={"max_restarts": 20}), headers=world.h("member"))
    assert r.status_code == 201


def test_upgraded_teams_keep_what_they_used() -> None:
    """The migration: every team keeps the ordinary classes and its default contract's class; the first
    admin's ``default`` team keeps every class."""
    with temporary_database("kiln_sec_qos") as url:
        upgrade(url, "0002")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                for name in ("default", "alpha", "beta"):
                    conn.execute(
                        text(
                            "INSERT INTO teams (name, fair_share_weight, budget_period_s, created_at) "
                            "VALUES (:n, 1, 86400, now())"
                        ),
                        {"n": name},
                    )
                conn.execute(
                    text(
                        "INSERT INTO sla_contracts (team_id, qos_class_id, max_restarts, recovery_time_objective_s,"
                        " checkpoint_interval_s, min_checkpoint_success_rate, step_time_tolerance,"
                        " created_at, updated_at)"
                        " SELECT t.id, q.id, 3, 300, 600, 0.999, 1.3, now(), now() FROM teams t, qos_classes q"
                        " WHERE t.name = 'alpha' AND q.name = 'gold'"
                    )
                )
            upgrade(url)
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT t.name, q.name FROM team_qos_classes x JOIN teams t ON t.id = x.team_id"
                        " JOIN qos_classes q ON q.id = x.qos_class_id"
                    )
                ).all()
                limits = dict(conn.execute(text("SELECT name, restart_limit FROM teams")).tuples().all())
        finally:
            engine.dispose()
    granted: dict[str, set[str]] = {}
    for team, qos in rows:
        granted.setdefault(team, set()).add(qos)
    ordinary = {"silver", "bronze", "best-effort"}
    assert granted == {"default": ordinary | {"gold"}, "alpha": ordinary | {"gold"}, "beta": ordinary}
    assert limits == {"default": 10, "alpha": 10, "beta": 10}
