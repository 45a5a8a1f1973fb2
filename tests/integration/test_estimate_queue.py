"""``POST /v1/estimates`` with a deadline counts the queue: the chosen option's expected start is the scheduler's own
projection (as ``kiln why``'s), with the job as it would be submitted added to the live queue; a run that alone ends
in time can still miss the deadline behind a running job, and the answer says so in a field and a sentence."""

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
from tests.support.measured_runs import record_run

pytestmark = pytest.mark.integration

GRACE_S = 60.0
CPU_JOB = {"recipe": {"name": "gpt", "hyperparameters": {"size": "tiny", "batch_size": 5}}, "steps": 100}


@pytest.fixture
def setup(db: Session, pg_engine: Engine, tmp_path: Path) -> Any:
    app = make_app(pg_engine, tmp_path, db, policy={"time_limit_grace_s": GRACE_S})
    with TestClient(app) as client:
        world = build_world(db, client)
        for job_id in world.jobs.values():  # the world's own queued jobs would go first: out of the way
            db.get_one(Job, job_id).state = "CANCELLED"
        db.add(Host(name="h1", queue="host.h1", state="UP", cpu_slots=2))
        db.flush()
        yield client, world


def _submitted(client: TestClient, world: World, db: Session, **fields: Any) -> Job:
    r = client.post("/v1/jobs", json=spec(**fields), headers=world.h("member"))
    assert r.status_code == 201, r.text
    return db.get_one(Job, r.json()["id"])


def _measured(client: TestClient, world: World, db: Session) -> None:
    """A finished run of CPU_JOB's shape: 10 s to its first step, then 1 s a step (100 steps: 110 s in all)."""
    job = _submitted(client, world, db, name="before", **CPU_JOB)
    record_run(db, job.id, startup_s=10, step_s=[1.0] * 50, gpu_type="cpu")
    job.state = "SUCCEEDED"
    db.flush()


def _estimate(client: TestClient, world: World, deadline: datetime) -> dict[str, Any]:
    body = spec(name="next", **CPU_JOB, sla={"deadline": deadline.isoformat()})
    r = client.post("/v1/estimates", json=body, headers=world.h("member"))
    assert r.status_code == 200, r.text
    return r.json()


def test_an_idle_cluster_starts_it_now_and_the_run_alone_decides(setup: Any, db: Session) -> None:
    client, world = setup
    _measured(client, world, db)
    answer = _estimate(client, world, utcnow() + timedelta(seconds=600))
    q = answer["queue"]
    assert q["verdict"] == "meets" and q["option"] == answer["recommended"] == 0
    start = datetime.fromisoformat(q["expected_start_earliest"])
    assert abs((start - utcnow()).total_seconds()) < 5 and q["expected_start_latest"] == q["expected_start_earliest"]
    assert datetime.fromisoformat(q["latest_end"]) - start == timedelta(seconds=110)
    assert q["sentence"].startswith("Counting the queue: the job as written would start at ")
    assert "it meets the deadline" in q["sentence"]
    assert not any("time in the queue is not counted" in n for n in answer["notes"])


def test_a_run_that_ends_in_time_alone_misses_the_deadline_behind_a_running_job(setup: Any, db: Session) -> None:
    client, world = setup
    _measured(client, world, db)
    # Both CPU slots held for 20 minutes more at the earliest (its time limit, started 10 minutes ago)
    running = _submitted(client, world, db, name="ahead", time_limit_s=1800, resources={"gpus": 0, "cpu_slots": 2})
    started = utcnow() - timedelta(minutes=10)
    running.state, running.admitted_at, running.started_at = "RUNNING", started, started
    db.add(
        Attempt(
            job_id=running.id,
            number=1,
            fencing_token=running.fencing_token,
            placement=[{"host": "h1", "slots": 2}],
            state="RUNNING",
            started_at=started,
        )
    )
    db.flush()
    answer = _estimate(client, world, utcnow() + timedelta(seconds=600))
    written = answer["options"][0]
    assert written["meets_deadline"] is True  # 110 s of run against 600 s: in time, were it to start now
    q = answer["queue"]
    assert q["verdict"] == "misses", q
    earliest = datetime.fromisoformat(q["expected_start_earliest"])  # as kiln expects the running job to use its limit
    assert earliest > utcnow() + timedelta(minutes=5)
    assert earliest + timedelta(seconds=110) > datetime.fromisoformat(answer["deadline"])
    assert "it misses the deadline" in q["sentence"] and "at the earliest" in q["sentence"]


def test_no_deadline_no_projection(setup: Any, db: Session) -> None:
    client, world = setup
    r = client.post("/v1/estimates", json=spec(name="free", **CPU_JOB), headers=world.h("member"))
    assert r.status_code == 200 and r.json()["queue"] is None
