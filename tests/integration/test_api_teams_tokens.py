"""Teams, memberships, SLA defaults, users, tokens and auth through the API against PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import ApiToken, Event, TeamQuota
from tests.support.api import World, auth, make_app, spec

pytestmark = pytest.mark.integration


def _audit(db: Session, type_: str) -> list[Event]:
    return list(db.scalars(select(Event).where(Event.type == type_, Event.job_id.is_(None)).order_by(Event.id)))


def test_team_crud_and_quotas(client: TestClient, world: World, db: Session) -> None:
    h = world.h("admin")
    body = {
        "name": "nlp",
        "cohort": "research",
        "fair_share_weight": 2.5,
        "gpu_hour_budget": 100,
        "quotas": [{"gpu_type": "H200", "nominal": 8, "borrowing_limit": 4, "lending_limit": 2}],
    }
    r = client.post("/v1/teams", json=body, headers=h)
    assert r.status_code == 201, r.text
    team = r.json()
    assert team["quotas"] == [{"gpu_type": "H200", "nominal": 8, "borrowing_limit": 4, "lending_limit": 2}]
    assert client.post("/v1/teams", json=body, headers=h).status_code == 409
    r = client.patch(
        "/v1/teams/nlp",
        json={
            "quotas": [{"gpu_type": "H200", "nominal": 2}, {"gpu_type": "cpu", "nominal": 4}],
            "fair_share_weight": 1.0,
        },
        headers=h,
    )
    assert r.status_code == 200, r.text
    assert {q["gpu_type"]: q["nominal"] for q in r.json()["quotas"]} == {"H200": 2, "cpu": 4}
    assert r.json()["fair_share_weight"] == 1.0 and r.json()["cohort"] == "research"
    rows = db.scalars(select(TeamQuota).where(TeamQuota.team_id == team["id"])).all()
    assert len(rows) == 2
    dup = {"quotas": [{"gpu_type": "H200", "nominal": 1}, {"gpu_type": "H200", "nominal": 2}]}
    assert client.patch("/v1/teams/nlp", json=dup, headers=h).json()["errors"][0]["loc"] == "quotas.1.gpu_type"
    assert client.get("/v1/teams/nlp", headers=h).json()["name"] == "nlp"
    assert client.delete("/v1/teams/nlp", headers=h).status_code == 204
    assert client.get("/v1/teams/nlp", headers=h).status_code == 404
    assert client.delete("/v1/teams/alpha", headers=h).status_code == 409  # it has jobs
    names = [t["name"] for t in client.get("/v1/teams", headers=world.h("member")).json()["items"]]
    assert names == ["alpha"]


def test_memberships_with_audit_events(client: TestClient, world: World, db: Session) -> None:
    h = world.h("team-admin")
    r = client.put("/v1/teams/alpha/members/bob", json={"role": "viewer"}, headers=h)
    assert r.status_code == 202 and (r.json()["status"], r.json()["role"]) == ("invited", "viewer")
    assert client.get(f"/v1/jobs/{world.jobs['alpha']}", headers=world.h("beta-member")).status_code == 404
    r = client.post("/v1/me/invitations/alpha/accept", headers=world.h("beta-member"))
    assert r.status_code == 201 and (r.json()["user"], r.json()["role"]) == ("bob", "viewer")
    r = client.put("/v1/teams/alpha/members/bob", json={"role": "member"}, headers=h)
    assert r.status_code == 200 and r.json()["role"] == "member"
    r = client.put("/v1/teams/alpha/members/bob", json={"role": "member"}, headers=h)
    assert r.status_code == 200
    members = {m["user"]: m["role"] for m in client.get("/v1/teams/alpha/members", headers=h).json()["items"]}
    assert members == {"alice": "team-admin", "bob": "member", "mark": "member", "vera": "viewer"}
    # bob now sees alpha's jobs
    assert client.get(f"/v1/jobs/{world.jobs['alpha']}", headers=world.h("beta-member")).status_code == 200
    assert client.delete("/v1/teams/alpha/members/bob", headers=h).status_code == 204
    assert client.delete("/v1/teams/alpha/members/bob", headers=h).status_code == 404
    assert client.get(f"/v1/jobs/{world.jobs['alpha']}", headers=world.h("beta-member")).status_code == 404
    ghost = client.put("/v1/teams/alpha/members/ghost", json={"role": "member"}, headers=world.h("admin"))
    assert ghost.status_code == 404  # an admin adds directly, so an unknown user is an error
    assert client.put("/v1/teams/alpha/members/bob", json={"role": "owner"}, headers=h).status_code == 422
    alpha_id = client.get("/v1/teams/alpha", headers=h).json()["id"]
    audit = [
        (e.type, e.data.get("user"), e.actor_user_id, e.team_id)
        for e in _audit(db, "MEMBER_INVITED")
        + _audit(db, "MEMBER_ADDED")
        + _audit(db, "MEMBER_ROLE_CHANGED")
        + _audit(db, "MEMBER_REMOVED")
        if e.data.get("user") == "bob"
    ]
    alice, bob = world.users["team-admin"].id, world.users["beta-member"].id
    assert audit == [
        ("MEMBER_INVITED", "bob", alice, alpha_id),
        ("MEMBER_ADDED", "bob", bob, alpha_id),
        ("MEMBER_ROLE_CHANGED", "bob", alice, alpha_id),
        ("MEMBER_REMOVED", "bob", alice, alpha_id),
    ]


def test_team_default_sla(client: TestClient, world: World) -> None:
    r = client.get("/v1/teams/alpha/sla", headers=world.h("viewer"))
    assert r.status_code == 200 and (r.json()["qos"], r.json()["job_id"]) == ("silver", None)
    terms = {"qos": "bronze", "max_queue_wait_s": 120, "deadline": "2030-01-01T00:00:00+02:00", "max_restarts": 7}
    r = client.put("/v1/teams/alpha/sla", json=terms, headers=world.h("team-admin"))
    assert r.status_code == 200, r.text
    got = client.get("/v1/teams/alpha/sla", headers=world.h("member")).json()
    assert (got["qos"], got["max_queue_wait_s"], got["max_restarts"]) == ("bronze", 120.0, 7)
    assert got["deadline"].startswith("2029-12-31T22:00:00")
    bad = client.put("/v1/teams/alpha/sla", json={"qos": "platinum"}, headers=world.h("team-admin"))
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == "qos"


def test_users_me_and_admin_create(client: TestClient, world: World) -> None:
    me = client.get("/v1/me", headers=world.h("viewer")).json()
    assert (me["name"], me["is_admin"], me["teams"]) == ("vera", False, [{"team": "alpha", "role": "viewer"}])
    r = client.post("/v1/users", json={"name": "newbie", "email": "n@example.com"}, headers=world.h("admin"))
    assert r.status_code == 201 and r.json()["teams"] == []
    assert client.post("/v1/users", json={"name": "newbie"}, headers=world.h("admin")).status_code == 409
    names = {u["name"] for u in client.get("/v1/users", headers=world.h("admin")).json()["items"]}
    assert {"root", "alice", "mark", "vera", "bob", "newbie"} <= names


def test_token_lifecycle_with_audit(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    r = client.post("/v1/tokens", json={"name": "laptop", "expires_in_s": 3600}, headers=h)
    assert r.status_code == 201, r.text
    created = r.json()
    secret = created["secret"]
    assert secret.startswith("kiln_") and created["prefix"] == secret[:11] and created["user"] == "mark"
    stored = db.get(ApiToken, created["id"])
    assert stored is not None and secret not in stored.token_hash and len(stored.token_hash) == 64
    assert client.get("/v1/me", headers=auth(secret)).json()["name"] == "mark"
    listed = client.get("/v1/tokens", headers=h).json()["items"]
    assert all("secret" not in t for t in listed) and created["id"] in [t["id"] for t in listed]
    assert next(t for t in listed if t["id"] == created["id"])["last_used_at"] is not None
    # another member cannot see or revoke it (404, not 403: no existence leak)
    assert client.delete(f"/v1/tokens/{created['id']}", headers=world.h("viewer")).status_code == 404
    r = client.delete(f"/v1/tokens/{created['id']}", headers=h)
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    denied = client.get("/v1/me", headers=auth(secret))
    assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
    assert "revoked" in denied.json()["detail"]
    issued = [e.data["token_id"] for e in _audit(db, "TOKEN_ISSUED")]
    revoked = [(e.data["token_id"], e.actor_user_id) for e in _audit(db, "TOKEN_REVOKED")]
    assert created["id"] in issued and revoked == [(created["id"], world.users["member"].id)]


def test_token_rules(client: TestClient, world: World, db: Session) -> None:
    r = client.post("/v1/tokens", json={"name": "for-bob", "user": "bob"}, headers=world.h("admin"))
    assert r.status_code == 201 and r.json()["user"] == "bob"
    assert client.get("/v1/me", headers=auth(r.json()["secret"])).json()["name"] == "bob"
    assert client.post("/v1/tokens", json={"name": "x", "user": "bob"}, headers=world.h("member")).status_code == 403
    assert (
        client.post("/v1/tokens", json={"name": "x", "scopes": ["admin"]}, headers=world.h("member")).status_code == 403
    )
    assert (
        client.post("/v1/tokens", json={"name": "x", "scopes": ["root"]}, headers=world.h("member")).status_code == 422
    )
    past = {"name": "x", "expires_at": "2001-01-01T00:00:00Z"}
    assert client.post("/v1/tokens", json=past, headers=world.h("member")).status_code == 422
    ro = client.post("/v1/tokens", json={"name": "ro", "scopes": ["read"]}, headers=world.h("member")).json()
    assert client.get("/v1/jobs", headers=auth(ro["secret"])).status_code == 200
    denied = client.post("/v1/jobs", json=spec(), headers=auth(ro["secret"]))
    assert denied.status_code == 403 and "write" in denied.json()["detail"]
    # an admin user whose token lacks the admin scope is an ordinary user
    plain = client.post("/v1/tokens", json={"name": "plain"}, headers=world.h("admin")).json()
    assert client.get("/v1/users", headers=auth(plain["secret"])).status_code == 403
    assert client.get(f"/v1/jobs/{world.jobs['beta']}", headers=auth(plain["secret"])).status_code == 404
    # expiry
    token = db.get(ApiToken, ro["id"])
    assert token is not None
    token.expires_at = utcnow() - timedelta(seconds=1)
    db.flush()
    expired = client.get("/v1/me", headers=auth(ro["secret"]))
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]
    for bad in ({}, {"Authorization": "Bearer kiln_nope"}, {"Authorization": "Basic abc"}):
        r = client.get("/v1/me", headers=bad)
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"


def test_rate_limit_per_token(db: Session, pg_engine: Engine, tmp_path: Path, world: World) -> None:
    app = make_app(pg_engine, tmp_path, db, rate_limit_per_minute=60, rate_limit_burst=3)
    with TestClient(app) as c:
        codes = [c.get("/v1/me", headers=world.h("member")).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        r = c.get("/v1/me", headers=world.h("member"))
        assert r.headers["content-type"] == "application/problem+json" and int(r.headers["retry-after"]) >= 1
        assert c.get("/v1/me", headers=world.h("viewer")).status_code == 200  # another token, another bucket


def test_rate_limit_is_shared_by_api_processes_through_redis(tmp_path: Path, pg_engine: Engine) -> None:
    import time
    import uuid

    from api.ratelimit import RedisTokenBucketLimiter, TokenBucketLimiter
    from harness.services import redis_url

    url = redis_url()
    prefix = f"kiln-test:{uuid.uuid4().hex}:"
    # Two API processes (or replicas) with one Redis: one bucket per token between them (a token per 10 s, so a
    # slow machine cannot refill one between these calls).
    a, b = (RedisTokenBucketLimiter(url, per_minute=6, burst=3, prefix=prefix) for _ in range(2))
    assert [a.take(7), b.take(7), a.take(7)] == [0.0, 0.0, 0.0]
    assert 0 < b.take(7) <= 10.0  # the fourth request within the burst waits for a refill
    assert a.take(8) == 0.0  # another token, another bucket
    assert 0 < a.client.pttl(f"{prefix}7") <= 31_000  # the key expires once its bucket would be full again
    c, d = (RedisTokenBucketLimiter(url, per_minute=6000, burst=1, prefix=prefix) for _ in range(2))
    assert c.take(9) == 0.0
    time.sleep(0.05)
    assert d.take(9) == 0.0  # 100 tokens/s: refilled, whichever process asks

    # Redis away: each process limits on its own instead of failing the request.
    away = RedisTokenBucketLimiter("redis://127.0.0.1:1/0", per_minute=6, burst=2, prefix=prefix)
    assert [away.take(7), away.take(7)] == [0.0, 0.0] and away.take(7) > 0

    # The app shares its buckets when Redis is the broker, and keeps them in process with the embedded broker.
    assert isinstance(make_app(pg_engine, tmp_path, broker_url=url).state.limiter, RedisTokenBucketLimiter)
    assert isinstance(make_app(pg_engine, tmp_path).state.limiter, TokenBucketLimiter)


def test_qos_list_get_patch(client: TestClient, world: World) -> None:
    names = [q["name"] for q in client.get("/v1/qos", headers=world.h("viewer")).json()["items"]]
    assert names == ["gold", "silver", "bronze", "best-effort"]
    r = client.patch("/v1/qos/bronze", json={"priority": 250, "sm_percent": 50}, headers=world.h("admin"))
    assert r.status_code == 200 and (r.json()["priority"], r.json()["sm_percent"]) == (250, 50)
    assert client.patch("/v1/qos/bronze", json={"sm_percent": 0}, headers=world.h("admin")).status_code == 422
    assert client.get("/v1/qos/bronze", headers=world.h("member")).json()["priority"] == 250
    assert client.get("/v1/qos/platinum", headers=world.h("member")).status_code == 404
