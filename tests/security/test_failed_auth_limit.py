"""The failed-authentication limit refuses failed authentications only: a stream of bad tokens from one client
address never locks out the valid users of that address (the review's finding: 26 of 30 valid requests got 429,
the admin's included, while a guesser shared their address, a NAT or a proxy).

Before: once the address's bucket was empty, every request from it got 429 before its token was looked up. Now the
token is looked up first (one indexed read of its SHA-256, as for any request); a valid one goes on to its own
user's rate limit, a bad one counts against the address and, past the limit, gets 429. The limit's buckets are
tested in process and shared through a real Redis, as deployments with several API processes keep them."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.services import redis_url
from tests.support.api import auth, build_world, make_app

pytestmark = pytest.mark.integration

ROLES = ("member", "viewer", "team-admin", "admin", "beta-member")


def _address() -> tuple[str, int]:
    """A client address of this test's own (IPv6 documentation range, 2^64 of them), so a shared Redis bucket from
    another run never counts."""
    return f"2001:db8::{secrets.token_hex(2)}:{secrets.token_hex(2)}:{secrets.token_hex(2)}", 40000


def _settings(shared: bool, **more: object) -> dict[str, object]:
    settings: dict[str, object] = {"auth_failures_per_minute": 1, "auth_failures_burst": 3, **more}
    if shared:
        settings["broker_url"] = redis_url()
    return settings


@pytest.mark.parametrize("shared", [False, True], ids=["in-process", "redis"])
def test_bad_tokens_from_an_address_never_lock_out_its_valid_users(
    db: Session, pg_engine: Engine, tmp_path: Path, shared: bool
) -> None:
    app = make_app(pg_engine, tmp_path, db, **_settings(shared))
    with TestClient(app, client=_address()) as client:
        world = build_world(db, client)
        bad, valid = [], []
        for i in range(30):  # interleaved, as a guesser behind the users' NAT would send them
            bad.append(client.get("/v1/me", headers=auth(f"kiln_guess{i}")).status_code)
            valid.append(client.get("/v1/me", headers=world.h(ROLES[i % len(ROLES)])).status_code)
        assert valid == [200] * 30
        # The guesser is limited as before: three failures, then 429 for every further bad token.
        assert bad[:3] == [401, 401, 401] and bad[3:] == [429] * 27
        refused = client.get("/v1/me", headers=auth("kiln_guess-again"))
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "failed authentications" in refused.json()["detail"]
        # Writes too, and a revoked token counts as a failure like any other bad one.
        minted = client.post("/v1/tokens", json={"name": "short"}, headers=world.h("member"))
        assert minted.status_code == 201
        assert client.delete(f"/v1/tokens/{minted.json()['id']}", headers=world.h("member")).status_code == 200
        assert client.get("/v1/me", headers=auth(minted.json()["secret"])).status_code == 429


@pytest.mark.parametrize("shared", [False, True], ids=["in-process", "redis"])
def test_a_valid_token_meets_only_its_own_users_rate_limit(
    db: Session, pg_engine: Engine, tmp_path: Path, shared: bool
) -> None:
    app = make_app(pg_engine, tmp_path, db, **_settings(shared, rate_limit_per_minute=1, rate_limit_burst=40))
    with TestClient(app, client=_address()) as client:
        world = build_world(db, client)  # the member spent one request submitting a job
        left = 39
        if shared:  # user ids start at 1 in each test database: a bucket an earlier run left in Redis is not ours
            import redis

            keys = [f"kiln:ratelimit:user:{world.users[r].id}" for r in ("member", "viewer")]
            redis.Redis.from_url(str(_settings(True)["broker_url"])).delete(*keys)
            left = 40
        assert [client.get("/v1/me", headers=auth(f"kiln_x{i}")).status_code for i in range(4)] == [401] * 3 + [429]
        member = [client.get("/v1/me", headers=world.h("member")) for _ in range(left + 1)]
        assert [r.status_code for r in member] == [200] * left + [429]
        assert "rate limit exceeded for this user" in member[-1].json()["detail"]
        assert client.get("/v1/me", headers=world.h("viewer")).status_code == 200  # another user, another bucket
