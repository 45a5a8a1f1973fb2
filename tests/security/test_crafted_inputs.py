"""Crafted cursors and ids on the dashboard's routes are a 4xx problem, never a 500, on PostgreSQL and SQLite.

Before: non-integer, huge or null cursor positions, and a job id past 64 bits, answered 500."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.security.live import Live
from tests.support.api import World


def cursor(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


CURSORS = [
    cursor({"pos": "x"}),
    cursor({"pos": None}),
    cursor({"pos": 1e300}),
    cursor({"pos": 10**30}),
    cursor({"id": "7"}),
    cursor({"id": -5}),
    cursor({"id": 2**64}),
    cursor({"id": True}),
    cursor([1]),
    cursor("pos"),
    cursor({}),
    "!!!",
    "e30",
    "A" * 199,
]
HUGE = str(2**64)


def crafted(job: int) -> list[str]:
    paths = [
        f"/v1/dashboard/queue?view={view}&cursor={c}" for view in ("waiting", "active", "finished") for c in CURSORS
    ]
    paths += [f"/v1/jobs?cursor={c}" for c in CURSORS]
    for bad in (HUGE, "-1", "0", "1e3", "abc"):
        paths += [
            f"/v1/dashboard/jobs/{bad}",
            f"/v1/dashboard/jobs/{bad}/metrics",
            f"/v1/dashboard/jobs/{bad}/stream",
            f"/v1/jobs/{bad}",
            f"/v1/jobs/{bad}/events",
        ]
    paths += [
        f"/v1/dashboard/jobs/{job}/metrics?after_id={HUGE}",
        f"/v1/dashboard/jobs/{job}/stream?after_id=-1",
        f"/v1/jobs/{job}/events?after={HUGE}",
        "/v1/dashboard/queue?team=%00",
        "/v1/dashboard/queue?qos=" + "q" * 500,
        "/v1/sla/attainment?team=" + "t" * 500,
        "/v1/dashboard/queue?team=../x",
    ]
    return paths


def assert_problems(get: Any, job: int) -> None:
    bad = []
    for path in crafted(job):
        r = get(path)
        if not 400 <= r.status_code < 500 or not r.headers["content-type"].startswith("application/problem+json"):
            bad.append((path, r.status_code, r.text[:200]))
    assert bad == []


@pytest.mark.integration
def test_crafted_inputs_on_postgresql(client: TestClient, world: World) -> None:
    assert_problems(lambda path: client.get(path, headers=world.h("admin")), world.jobs["alpha"])


@pytest.mark.e2e
def test_crafted_inputs_on_sqlite(live: Live) -> None:
    with httpx.Client(base_url=live.kiln.url, headers=live.headers(), timeout=30) as http:
        assert_problems(http.get, live.job)
