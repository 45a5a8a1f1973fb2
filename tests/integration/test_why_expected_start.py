"""``GET /v1/jobs/{id}/why``'s expected start: the scheduler's ``plan()`` run forward from the live snapshot, earliest
(running jobs end by their measured progress, else as kiln expects them to use their limits) and latest (at their
time limits and the scheduler's grace), or "cannot be known" with the reason; never both."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Host, Job
from core.policy_config import PolicyConfig
from scheduler.live.loader import load_snapshot
from scheduler.policy.plan import plan
from tests.support.api import World, build_world, make_app, spec
from tests.support.measured_runs import set_running

pytestmark = pytest.mark.integration

GRACE_S = 60.0


@pytest.fixture
def setup(db: Session, pg_engine: Engine, tmp_path: Path) -> Any:
    app = make_app(pg_engine, tmp_path, db, policy={"time_limit_grace_s": GRACE_S})
    with TestClient(app) as client:
        world = build_world(db, client)
        for job_id in world.jobs.values():  # the world's own queued jobs would go first: out of the way
            job = db.get(Job, job_id)
            assert job is not None
            job.state = "CANCELLED"
        db.add(Host(name="h1", queue="host.h1", state="UP", cpu_slots=3))
        db.flush()
        yield client, world


def _job(client: TestClient, world: World, db: Session, **fields: Any) -> Job:
    r = client.post("/v1/jobs", json=spec(**fields), headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = db.get(Job, r.json()["id"])
    assert job is not None
    return job


def _running(db: Session, job: Job, started: datetime, slots: int = 1, **attempt: Any) -> None:
    set_running(db, job, {"host": "h1", "slots": slots}, started, **attempt)


def _why(client: TestClient, world: World, job: Job) -> dict[str, Any]:
    r = client.get(f"/v1/jobs/{job.id}/why", headers=world.h("viewer"))
    assert r.status_code == 200, r.text
    return r.json()


def _at(data: dict[str, Any], key: str = "expected_start") -> datetime:
    return datetime.fromisoformat(data[key])


def _near(a: datetime, b: datetime) -> bool:
    return abs((a - b).total_seconds()) < 5  # the request reads its own clock


def _plan_as_the_scheduler_does(db: Session) -> None:
    """One cycle's pending reasons, written as ``scheduler.live.apply`` writes them."""
    decisions = plan(load_snapshot(db=db, now=utcnow()), PolicyConfig(time_limit_grace_s=GRACE_S))
    for p in decisions.pending:
        job = db.get(Job, p.job_id)
        assert job is not None
        job.pending_reason, job.pending_message = p.reason.value, p.message
    db.flush()


def test_the_start_is_a_range_from_the_plan_run_forward(setup: Any, db: Session) -> None:
    client, world = setup
    now = utcnow()
    short = _job(client, world, db, name="short", time_limit_s=3600)
    long = _job(client, world, db, name="long", time_limit_s=7200)
    endless = _job(client, world, db, name="endless")
    _running(db, short, now - timedelta(minutes=50))  # has run 50 of its 60 minutes ...
    _running(db, long, now - timedelta(minutes=1))
    _running(db, endless, now - timedelta(days=3))  # ... and how long this one ran says nothing
    waiting = _job(client, world, db, name="waiting", resources={"gpus": 0, "cpu_slots": 1})
    _plan_as_the_scheduler_does(db)

    data = _why(client, world, waiting)
    # latest: `short` at its limit, plus the grace; earliest: as kiln expects a job to use its limit (half of what
    # is left, for a team with no history: the policy's own estimate)
    assert _near(_at(data, "expected_start_latest"), short.started_at + timedelta(seconds=3600 + GRACE_S))  # type: ignore[operator]
    assert _near(_at(data), now + timedelta(seconds=300))
    assert data["expected_start_hosts"] == ["h1"]
    assert data["expected_start_basis"].startswith("the scheduler's plan run forward")

    # two slots: `long`'s limit too
    waiting.spec = {**waiting.spec, "resources": {"gpus": 0, "cpu_slots": 2}}
    db.flush()
    data = _why(client, world, waiting)
    assert _near(_at(data, "expected_start_latest"), long.started_at + timedelta(seconds=7200 + GRACE_S))  # type: ignore[operator]

    # three slots: only if `endless` ends, which nothing bounds: no start is promised, and it says which job
    waiting.spec = {**waiting.spec, "resources": {"gpus": 0, "cpu_slots": 3}}
    db.flush()
    data = _why(client, world, waiting)
    assert data["expected_start"] is None and data["expected_start_latest"] is None
    assert data["expected_start_basis"].startswith(f"cannot be known: it starts only after running job(s) {endless.id}")


def test_measured_progress_sets_a_running_jobs_end(setup: Any, db: Session) -> None:
    client, world = setup
    now = utcnow()
    busy = _job(client, world, db, name="busy", steps=1000, time_limit_s=7200, resources={"gpus": 0, "cpu_slots": 3})
    busy.last_step = 100
    _running(
        db, busy, now - timedelta(seconds=120), slots=3, first_step_at=now - timedelta(seconds=100), heartbeat_at=now
    )
    waiting = _job(client, world, db, name="waiting")
    data = _why(client, world, waiting)
    # 900 steps left at 1 step/s: 900 s; the latest at the slowest pace kiln plans on (1.3x), within its limit
    assert _near(_at(data), now + timedelta(seconds=900))
    assert _near(_at(data, "expected_start_latest"), now + timedelta(seconds=1170))
    assert "measured progress" in data["expected_start_basis"]


def test_why_never_says_a_time_and_cannot_be_known_together(setup: Any, db: Session) -> None:
    """Issue 42, point 2: a job queued behind a job with no time limit read "expected start at 16:30:10Z" (the
    reservation's message, from kiln's guess of the running job's end) and then "expected start: cannot be known"."""
    client, world = setup
    endless = _job(client, world, db, name="endless", resources={"gpus": 0, "cpu_slots": 3})
    _running(db, endless, utcnow() - timedelta(hours=1), slots=3)
    waiting = _job(client, world, db, name="waiting")
    _plan_as_the_scheduler_does(db)
    data = _why(client, world, waiting)
    said = f"{data['pending_message']} | {data['expected_start_basis']}"
    assert data["pending_reason"] == "Reservation"
    assert "cannot be known" in said
    assert not re.search(r"\d\d:\d\d", said), said  # so no time anywhere in the answer
    assert data["expected_start"] is None


def test_reasons_that_no_clock_bounds_say_so(setup: Any, db: Session) -> None:
    client, world = setup
    job = _job(client, world, db, name="free")
    assert _near(_at(_why(client, world, job)), utcnow())  # not planned yet, and the slots are free: now
    for reason, words in (
        ("Dependency", "whether they succeed"),
        ("Budget", "GPU-hour budget"),
        ("Held", "it is held"),
    ):
        job.pending_reason = reason
        db.flush()
        data = _why(client, world, job)
        assert data["expected_start"] is None and data["expected_start_basis"].startswith("cannot be known: ")
        assert words in data["expected_start_basis"], data
    backoff = utcnow() + timedelta(minutes=5)
    job.pending_reason, job.not_before = "Backoff", backoff
    db.flush()
    data = _why(client, world, job)
    assert _near(_at(data), backoff) and _near(_at(data, "expected_start_latest"), backoff)  # its backoff's end
    cancelled = client.post(f"/v1/jobs/{job.id}/cancel", headers=world.h("member"))
    assert cancelled.status_code == 202
    data = _why(client, world, job)
    assert data["expected_start"] is None and data["expected_start_basis"] is None  # not waiting


def test_a_job_ahead_without_a_time_limit_is_named_as_ahead_not_running(setup: Any, db: Session) -> None:
    client, world = setup
    busy = _job(client, world, db, name="busy", time_limit_s=600, resources={"gpus": 0, "cpu_slots": 3})
    _running(db, busy, utcnow(), slots=3)
    ahead = _job(client, world, db, name="ahead")  # no time limit: once it starts, nothing bounds its end
    waiting = _job(client, world, db, name="waiting", resources={"gpus": 0, "cpu_slots": 3})
    data = _why(client, world, waiting)
    assert data["expected_start"] is None
    assert f"after job(s) {ahead.id} ahead of it in the queue end" in data["expected_start_basis"], data
