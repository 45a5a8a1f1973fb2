"""Tokens: a minted token never exceeds its parent; the rate limit does not multiply by minting; failed
authentications are limited.

Before: a token that expires in 60 s minted one with no expiry and one for 10 years; a write-only token minted
a read+write one; every minted token had a rate-limit bucket of its own (no cap on tokens per user); failed
authentications were never limited."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.db import utcnow
from tests.support.api import World, auth, build_world, make_app

pytestmark = pytest.mark.integration


def _mint(client: TestClient, parent: str, **body: object) -> tuple[int, dict[str, object]]:
    r = client.post("/v1/tokens", json={"name": "child", **body}, headers=auth(parent))
    return r.status_code, r.json()


def test_a_minted_token_never_outlives_its_parent(client: TestClient, world: World) -> None:
    status, short = _mint(client, world.tokens["member"], expires_in_s=60)
    assert status == 201
    parent_expiry = datetime.fromisoformat(str(short["expires_at"]))
    status, child = _mint(client, str(short["secret"]))  # no expiry asked: it inherits the parent's
    assert status == 201 and datetime.fromisoformat(str(child["expires_at"])) == parent_expiry
    status, body = _mint(client, str(short["secret"]), expires_in_s=10 * 365 * 86400)
    assert status == 422 and body["errors"][0]["loc"] == "expires_at"
    later = (utcnow() + timedelta(days=1)).isoformat()
    assert _mint(client, str(short["secret"]), expires_at=later)[0] == 422


def test_a_minted_token_never_has_more_scopes_than_its_parent(client: TestClient, world: World) -> None:
    status, write_only = _mint(client, world.tokens["member"], scopes=["write"])
    assert status == 201
    status, body = _mint(client, str(write_only["secret"]), scopes=["read", "write"])
    assert status == 403 and "read" in str(body["detail"])
    status, child = _mint(client, str(write_only["secret"]))  # default: the parent's own ordinary scopes
    assert status == 201 and child["scopes"] == ["write"]
    # Only an admin grants the scrape-only scope, and only an admin's token carries admin powers on.
    assert _mint(client, world.tokens["member"], scopes=["metrics"])[0] == 403
    assert _mint(client, world.tokens["admin"], scopes=["metrics"])[0] == 201


def test_live_tokens_per_user_are_capped(db: Session, pg_engine: Engine, tmp_path: Path) -> None:
    with TestClient(make_app(pg_engine, tmp_path, db, max_tokens_per_user=3)) as client:
        world = build_world(db, client)  # the member holds one token already
        assert [_mint(client, world.tokens["member"])[0] for _ in range(3)] == [201, 201, 409]


def test_the_rate_limit_is_per_user_however_many_tokens(db: Session, pg_engine: Engine, tmp_path: Path) -> None:
    app = make_app(pg_engine, tmp_path, db, rate_limit_per_minute=1, rate_limit_burst=3)
    with TestClient(app) as client:
        world = build_world(db, client)  # the member submitted one job: one of their three requests is spent
        minted = [_mint(client, world.tokens["member"])[1]["secret"] for _ in range(1)]
        assert client.get("/v1/jobs", headers=auth(str(minted[0]))).status_code == 200
        # The member's three are spent, whichever token asks; another user still has their own.
        for secret in (world.tokens["member"], minted[0]):
            assert client.get("/v1/jobs", headers=auth(str(secret))).status_code == 429
        assert client.get("/v1/jobs", headers=world.h("viewer")).status_code == 200


def test_failed_authentications_are_limited(db: Session, pg_engine: Engine, tmp_path: Path) -> None:
    app = make_app(pg_engine, tmp_path, db, auth_failures_per_minute=1, auth_failures_burst=3)
    with TestClient(app) as client:
        world = build_world(db, client)
        codes = [client.get("/v1/me", headers=auth(f"kiln_guess{i}")).status_code for i in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        # Bad tokens from the address are refused until the bucket refills; a valid one is not (see
        # test_failed_auth_limit.py).
        r = client.get("/v1/me", headers=auth("kiln_guess5"))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert client.get("/v1/me", headers=world.h("member")).status_code == 200
