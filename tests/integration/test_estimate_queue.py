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
from core.models import GPU, Attempt, Host, Job, TeamQuota
from tests.support.api import World, build_world, make_app, spec
from tests.support.measured_runs import record_run, set_running

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
    set_running(db, running, {"host": "h1", "slots": 2}, utcnow() - timedelta(minutes=10))
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


GIB = 2**30
GPU_JOB = {
    "recipe": {"name": "gpt", "hyperparameters": {"size": "mini", "batch_size": 8}},
    "steps": 100,
    "resources": {"gpus": 1, "gpu_type": "H100"},
}


def _gpu_hosts(db: Session, world: World) -> None:
    """One H100 host and one H200 host; the team may use 2 GPUs of any type."""
    team_id = db.get_one(Job, world.jobs["alpha"]).team_id
    db.add(TeamQuota(team_id=team_id, gpu_type="*", nominal=2))
    for name, model, memory in (("h100-a", "H100-80GB", 80 * GIB), ("h200-a", "H200", 141 * GIB)):
        host = Host(name=name, queue=f"q.{name}", state="UP", cpu_slots=0)
        host.gpus = [GPU(uuid=f"{name}-0", index=0, model=model, memory_bytes=memory)]
        db.add(host)
    db.flush()


def _running_on(client: TestClient, world: World, db: Session, host: str, *, ago: timedelta) -> Job:
    """A job holding ``host``'s one GPU, started ``ago``, with a 30-minute time limit."""
    job = _submitted(client, world, db, name="ahead", **{**GPU_JOB, "time_limit_s": 1800})
    set_running(db, job, {"host": host, "gpus": [f"{host}-0"]}, utcnow() - ago)
    return job


def test_the_queue_passes_over_the_cheapest_option_when_it_would_start_too_late(setup: Any, db: Session) -> None:
    """The H100 run is measured and cheapest by its run alone, but the only H100 is held for 20 minutes more: the
    recommendation is the H200 (scaled from the H100's run, dearer), which starts now and ends in time. Before:
    the H100 was recommended with the verdict "misses"."""
    client, world = setup
    _gpu_hosts(db, world)
    before = _submitted(client, world, db, name="before", **GPU_JOB)
    record_run(db, before.id, startup_s=10, step_s=[1.0] * 50, gpu_type="H100-80GB")
    before.state = "SUCCEEDED"
    _running_on(client, world, db, "h100-a", ago=timedelta(minutes=10))
    body = spec(name="next", **GPU_JOB, sla={"deadline": (utcnow() + timedelta(seconds=900)).isoformat()})
    r = client.post("/v1/estimates", json=body, headers=world.h("member"))
    assert r.status_code == 200, r.text
    answer = r.json()
    options, q = answer["options"], answer["queue"]
    cheapest = min(
        (i for i, o in enumerate(options) if o["cost"] is not None and o["meets_deadline"]),
        key=lambda i: (options[i]["step_time"]["basis"] != "measured", options[i]["cost"]),
    )
    assert options[cheapest]["gpu_type"] == "H100-80GB"  # by its run alone
    chosen = options[answer["recommended"]]
    assert chosen["gpu_type"] == "H200" and q["option"] == answer["recommended"], (chosen, q)
    assert q["passed_over"] and q["passed_over"][0] == cheapest, q
    assert q["verdict"] == "meets" and q["hosts"] == ["h200-a"], q
    assert "Cheaper by the run alone but later in the queue: 1 x H100-80GB" in q["sentence"], q["sentence"]
    assert "(may miss)" in q["sentence"] or "(misses)" in q["sentence"]  # the running job may end early
    assert answer["summary"].startswith("cheapest that meets the deadline counting the queue: 1 x H200"), answer
    # Nothing held: the H100 is the recommendation again, and nothing is passed over.
    db.query(Attempt).filter(Attempt.state == "RUNNING").update({"state": "SUCCEEDED"})
    db.query(Job).filter(Job.state == "RUNNING").update({"state": "SUCCEEDED"})
    db.flush()
    again = client.post("/v1/estimates", json=body, headers=world.h("member")).json()
    assert again["recommended"] == cheapest and again["queue"]["passed_over"] == [], again["queue"]
    assert again["queue"]["verdict"] == "meets"
