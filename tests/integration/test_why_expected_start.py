"""``GET /v1/jobs/{id}/why``'s expected start: a bound from the running jobs' time limits (and the scheduler's grace
before its kill), or a reason why no start can be promised; never from how long jobs ran."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Attempt, Host, Job
from tests.support.api import World, build_world, make_app, spec

pytestmark = pytest.mark.integration

GRACE_S = 60.0


@pytest.fixture
def setup(db: Session, pg_engine: Engine, tmp_path: Path) -> Any:
    app = make_app(pg_engine, tmp_path, db, policy={"time_limit_grace_s": GRACE_S})
    with TestClient(app) as client:
        world = build_world(db, client)
        db.add(Host(name="h1", queue="host.h1", state="UP", cpu_slots=3))
        db.flush()
        yield client, world


def _job(client: TestClient, world: World, db: Session, **fields: Any) -> Job:
    r = client.post("/v1/jobs", json=spec(**fields), headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = db.get(Job, r.json()["id"])
    assert job is not None
    return job


def _running(db: Session, job: Job, started: datetime, slots: int = 1) -> None:
    job.state, job.admitted_at, job.started_at = "RUNNING", started, started
    db.add(Attempt(job_id=job.id, number=1, fencing_token=1, placement=[{"host": "h1", "slots": slots}],
                   state="RUNNING", started_at=started))  # fmt: skip
    db.flush()


def _why(client: TestClient, world: World, job: Job) -> dict[str, Any]:
    r = client.get(f"/v1/jobs/{job.id}/why", headers=world.h("viewer"))
    assert r.status_code == 200, r.text
    return r.json()


def _at(data: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(data["expected_start"])


def test_the_start_is_bounded_by_running_time_limits(setup: Any, db: Session) -> None:
    client, world = setup
    now = utcnow()
    # the world's two queued jobs hold nothing; three slots: two held by jobs with limits, one by a job without
    short = _job(client, world, db, name="short", time_limit_s=3600)
    long = _job(client, world, db, name="long", time_limit_s=7200)
    endless = _job(client, world, db, name="endless")
    _running(db, short, now - timedelta(minutes=50))  # has run 50 of its 60 minutes ...
    _running(db, long, now - timedelta(minutes=1))
    _running(db, endless, now - timedelta(days=3))  # ... and how long this one ran says nothing
    waiting = _job(client, world, db, name="waiting", resources={"gpus": 0, "cpu_slots": 1})
    waiting.pending_reason, waiting.pending_message = "Resources", "3/3 cpu slots in use"
    db.flush()

    data = _why(client, world, waiting)
    # one slot is needed: it is free at the latest when `short` reaches its limit, plus the scheduler's grace
    assert _at(data) == short.started_at + timedelta(seconds=3600 + GRACE_S)  # type: ignore[operator]
    assert data["expected_start_basis"].startswith(f"at the latest: 1 CPU slot free once running job(s) {short.id}")
    assert "unless a job ahead of it takes that capacity first" in data["expected_start_basis"]

    # two slots: `long`'s limit too; held for it by the scheduler, so said so
    waiting.spec = {**waiting.spec, "resources": {"gpus": 0, "cpu_slots": 2}}
    waiting.pending_reason = "Reservation"
    db.flush()
    data = _why(client, world, waiting)
    assert _at(data) == long.started_at + timedelta(seconds=7200 + GRACE_S)  # type: ignore[operator]
    assert f"job(s) {short.id}, {long.id} reach" in data["expected_start_basis"]
    assert "the scheduler holds that capacity for it" in data["expected_start_basis"]

    # three slots: only if `endless` ends, which nothing bounds: no start is promised, and it says which job
    waiting.spec = {**waiting.spec, "resources": {"gpus": 0, "cpu_slots": 3}}
    db.flush()
    data = _why(client, world, waiting)
    assert data["expected_start"] is None
    assert data["expected_start_basis"] == (
        f"cannot be known: running job(s) {endless.id} have no time limit (time_limit_s), and kiln does not guess "
        "how long a job runs"
    )


def test_reasons_that_no_clock_bounds_say_so(setup: Any, db: Session) -> None:
    client, world = setup
    job = db.get(Job, world.jobs["alpha"])
    assert job is not None
    assert _why(client, world, job)["expected_start_basis"].startswith("not planned yet")
    for reason, words in (("Dependency", "whether they succeed"), ("Quota", "the team's quota"),
                          ("Priority", "higher-priority job")):  # fmt: skip
        job.pending_reason = reason
        db.flush()
        data = _why(client, world, job)
        assert data["expected_start"] is None and data["expected_start_basis"].startswith("cannot be known: ")
        assert words in data["expected_start_basis"], data
    backoff = utcnow() + timedelta(minutes=5)
    job.pending_reason, job.not_before = "Backoff", backoff
    db.flush()
    data = _why(client, world, job)
    assert _at(data) == backoff and "restart backoff" in data["expected_start_basis"]
    cancelled = client.post(f"/v1/jobs/{job.id}/cancel", headers=world.h("member"))
    assert cancelled.status_code == 202
    data = _why(client, world, job)
    assert data["expected_start"] is None and data["expected_start_basis"] is None  # not waiting
