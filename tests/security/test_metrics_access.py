"""``/metrics`` answers only a scrape token (or an admin): anonymous callers learn no team name and cost no query.

Before: ``/metrics`` was open, listed every team's SLA figures, and ran database aggregates on each anonymous
scrape."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.support.api import World, auth
from tests.support.sql import statements

pytestmark = pytest.mark.integration


def test_metrics_need_a_scrape_token(client: TestClient, world: World, pg_engine: Engine) -> None:
    with statements(pg_engine) as ran:
        anonymous = client.get("/metrics")
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == "Bearer"
    assert "alpha" not in anonymous.text and "kiln_sla" not in anonymous.text
    assert ran == []  # refused before any database work
    assert client.get("/metrics", headers=world.h("member")).status_code == 403  # a member's token: no

    r = client.post("/v1/tokens", json={"name": "prometheus", "scopes": ["metrics"]}, headers=world.h("admin"))
    assert r.status_code == 201
    scraper = auth(r.json()["secret"])
    scraped = client.get("/metrics", headers=scraper)
    assert scraped.status_code == 200 and 'team="alpha"' in scraped.text
    assert client.get("/v1/jobs", headers=scraper).status_code == 403  # scrape-only: nothing else
    assert client.get("/metrics", headers=world.h("admin")).status_code == 200
