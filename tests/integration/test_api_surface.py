"""What other tools expect of an HTTP API: idempotent submissions, Location on 201, ETag / If-Match on what two
admins may edit at once. On PostgreSQL, through the app."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Job
from tests.support.api import World, spec

pytestmark = pytest.mark.integration


def _jobs_named(db: Session, name: str) -> int:
    return int(db.scalar(select(func.count()).select_from(Job).where(Job.name == name)) or 0)


def test_a_retried_submission_returns_the_first_job(client: TestClient, world: World, db: Session) -> None:
    headers = {**world.h("member"), "Idempotency-Key": "3f1c-retry-1"}
    first = client.post("/v1/jobs", json=spec(team="alpha", name="retried"), headers=headers)
    assert first.status_code == 201, first.text
    assert first.headers["location"] == f"/v1/jobs/{first.json()['id']}"
    assert "idempotent-replayed" not in first.headers
    again = client.post("/v1/jobs", json=spec(team="alpha", name="retried"), headers=headers)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.headers["location"] == first.headers["location"]
    assert _jobs_named(db, "retried") == 1

    other = client.post("/v1/jobs", json=spec(team="alpha", name="retried", steps=20), headers=headers)
    assert other.status_code == 422, other.text
    err = other.json()["errors"][0]
    assert err["loc"] == "header.Idempotency-Key" and f"it made job {first.json()['id']}" in err["msg"]

    # Keys are kept per team: the same key in another team is another submission.
    beta = client.post(
        "/v1/jobs",
        json=spec(team="beta", name="retried"),
        headers={**world.h("beta-member"), "Idempotency-Key": "3f1c-retry-1"},
    )
    assert beta.status_code == 201 and beta.json()["id"] != first.json()["id"]
    bad = client.post("/v1/jobs", json=spec(team="alpha"), headers={**world.h("member"), "Idempotency-Key": "a b"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == "header.Idempotency-Key"


def test_201s_carry_location(client: TestClient, world: World) -> None:
    team = client.post("/v1/teams", json={"name": "gamma"}, headers=world.h("admin"))
    assert team.status_code == 201 and team.headers["location"] == "/v1/teams/gamma"
    token = client.post("/v1/tokens", json={"name": "ci"}, headers=world.h("member"))
    assert token.status_code == 201 and token.headers["location"] == f"/v1/tokens/{token.json()['id']}"
    member = client.put("/v1/teams/gamma/members/mark", json={"role": "member"}, headers=world.h("admin"))
    assert member.status_code == 201 and member.headers["location"] == "/v1/teams/gamma/members/mark"


def test_two_admins_editing_a_team_at_once_do_not_lose_an_update(client: TestClient, world: World) -> None:
    admin = world.h("admin")
    read = client.get("/v1/teams/alpha", headers=admin)
    tag = read.headers["etag"]
    first = client.patch("/v1/teams/alpha", json={"restart_limit": 4}, headers={**admin, "If-Match": tag})
    assert first.status_code == 200, first.text
    assert first.headers["etag"] != tag and first.json()["restart_limit"] == 4
    second = client.patch("/v1/teams/alpha", json={"fair_share_weight": 2.0}, headers={**admin, "If-Match": tag})
    assert second.status_code == 412, second.text
    assert second.headers["content-type"] == "application/problem+json"
    assert "changed since you read it" in second.json()["detail"]
    assert client.get("/v1/teams/alpha", headers=admin).json()["fair_share_weight"] == 1.0
    fresh = client.get("/v1/teams/alpha", headers=admin).headers["etag"]
    assert fresh == first.headers["etag"]
    assert (
        client.patch(
            "/v1/teams/alpha", json={"fair_share_weight": 2.0}, headers={**admin, "If-Match": fresh}
        ).status_code
        == 200
    )
    assert client.patch("/v1/teams/alpha", json={"cohort": "c1"}, headers=admin).status_code == 200  # no If-Match
    assert (
        client.patch("/v1/teams/alpha", json={"cohort": "c2"}, headers={**admin, "If-Match": '"sla-v1"'}).status_code
        == 412
    )


def test_two_team_admins_editing_the_contract_at_once_do_not_lose_an_update(client: TestClient, world: World) -> None:
    h = world.h("team-admin")
    tag = client.get("/v1/teams/alpha/sla", headers=h).headers["etag"]
    body = {"qos": "silver", "max_queue_wait_s": 600}
    made = client.put("/v1/teams/alpha/sla", json=body, headers={**h, "If-Match": tag})
    assert made.status_code == 200 and made.headers["etag"] != tag
    stale = client.put("/v1/teams/alpha/sla", json={**body, "max_queue_wait_s": 60}, headers={**h, "If-Match": tag})
    assert stale.status_code == 412
    assert client.get("/v1/teams/alpha/sla", headers=h).json()["max_queue_wait_s"] == 600
    changed = client.put(
        "/v1/teams/alpha/sla", json={**body, "max_queue_wait_s": 300}, headers={**h, "If-Match": made.headers["etag"]}
    )
    assert changed.status_code == 200 and changed.json()["max_queue_wait_s"] == 300
