"""The checkpoint advice from real rows: the failure rate per GPU type from LOST events and usage, a job's
checkpoint cost from its CHECKPOINT events, and the line ``kiln describe`` prints."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Attempt, Job, Usage
from core.services.checkpoint_advice import PRIOR_MTBF_H, advise, failure_rates
from core.transitions import record_event
from tests.support.api import World, build_world, make_app, spec

pytestmark = pytest.mark.integration


@pytest.fixture
def world(db: Session, pg_engine: Engine, tmp_path: Path) -> Any:
    with TestClient(make_app(pg_engine, tmp_path, db)) as client:
        yield client, build_world(db, client)


def _job(client: TestClient, world: World, db: Session, **fields: Any) -> Job:
    r = client.post("/v1/jobs", json=spec(**fields), headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = db.get(Job, r.json()["id"])
    assert job is not None
    return job


def _ran(db: Session, job: Job, number: int, hosts: list[str], hours: float, ago_h: float, gpu_type: str) -> Attempt:
    start = utcnow() - timedelta(hours=ago_h)
    attempt = Attempt(
        job_id=job.id,
        number=number,
        fencing_token=number,
        state="RUNNING",
        started_at=start,
        placement=[{"host": h, "gpus": [f"{h}-0"]} for h in hosts],
    )
    db.add(attempt)
    db.flush()
    db.add(
        Usage(
            team_id=job.team_id,
            job_id=job.id,
            attempt_id=attempt.id,
            gpu_type=gpu_type,
            gpus=len(hosts),
            started_at=start,
            ended_at=start + timedelta(hours=hours),
        )
    )
    db.flush()
    return attempt


def _lost(db: Session, job: Job, attempt: Attempt, hosts: list[str], ago_h: float = 0.0) -> None:
    # the data core.lifecycle writes with a LOST transition
    record_event(
        db,
        "LOST",
        job=job,
        message="lease expired",
        now=utcnow() - timedelta(hours=ago_h),
        data={"attempt": attempt.number, "attempt_id": attempt.id, "hosts": hosts, "reason": "x"},
    )


def test_failures_per_host_hour_of_each_gpu_type(world: Any, db: Session) -> None:
    client, w = world
    job = _job(client, w, db, name="a", resources={"gpus": 1, "gpu_type": "H200"})
    # h1 busy 40 h (two overlapping attempts count once: 30 + 10 more), h2 busy 20 h: 60 host-hours of H200
    _ran(db, job, 1, ["h1"], 30, ago_h=100, gpu_type="H200")
    _ran(db, job, 2, ["h1"], 30, ago_h=90, gpu_type="H200")
    three = _ran(db, job, 3, ["h2"], 20, ago_h=50, gpu_type="H200")
    for _ in range(2):  # h2 failed once: its two LOSTs within 15 minutes are one incident
        _lost(db, job, three, ["h2"])
    other = _ran(db, job, 4, ["h1"], 1, ago_h=20, gpu_type="H200")
    _lost(db, job, other, ["h1"])
    _lost(db, job, _ran(db, job, 5, ["h3"], 1, ago_h=10, gpu_type="H100-80GB"), ["h3"])
    rates = failure_rates(db, utcnow())
    h200 = rates["H200"]
    assert (h200.failures, round(h200.host_hours)) == (2, 61)
    assert h200.from_prior and h200.mtbf_h == pytest.approx((61 + PRIOR_MTBF_H) / 3, rel=0.01)  # too few: the prior
    _lost(db, job, _ran(db, job, 6, ["h4"], 1, ago_h=5, gpu_type="H200"), ["h4"])
    h200 = failure_rates(db, utcnow())["H200"]
    assert (h200.failures, h200.from_prior) == (3, False) and h200.mtbf_h == pytest.approx(62 / 3, rel=0.01)
    assert rates["H100-80GB"].failures == 1


def test_the_advice_line_from_the_jobs_own_checkpoints(world: Any, db: Session) -> None:
    client, w = world
    job = _job(
        client,
        w,
        db,
        name="gpt",
        steps=20000,
        resources={"gpus": 1, "gpu_type": "H200"},
        checkpointing={"every_steps": 200},
    )
    assert advise(db, job, utcnow()) is None  # no checkpoint yet: nothing to advise from
    now = utcnow()
    for i in range(3):  # three incidents on h1, a day apart
        _lost(db, job, _ran(db, job, 1 + i, ["h1"], 0.1, ago_h=100 - 30 * i, gpu_type="H200"), ["h1"], ago_h=24 * i)
    attempt = _ran(db, job, 4, ["h1"], 114, ago_h=120, gpu_type="H200")  # the attempt running now
    attempt.first_step_at, attempt.heartbeat_at = now - timedelta(seconds=1800), now
    job.last_step, job.state = 1000, "RUNNING"  # 1.8 s a step
    for step, stall in ((200, 4.0), (400, 4.1), (600, 4.3)):
        record_event(db, "CHECKPOINT", job=job, data={"step": step, "stall_s": stall, "write_s": 9.0})
    db.flush()
    advice = advise(db, job, utcnow())
    assert advice is not None and advice.cost_s == pytest.approx(4.1) and advice.rate.failures == 3
    assert advice.summary.startswith("checkpoint every 200 steps (~6 min); advised ~")
    assert "(Young/Daly: save 4.1 s, MTBF 38 h on H200 from 3 failure(s) in 114 host-hours)" in advice.summary
    assert advice.loss_gpu_h is not None and advice.advised_loss_gpu_h is not None
    assert advice.advised_loss_gpu_h <= advice.loss_gpu_h, advice.summary
    shown = client.get(f"/v1/jobs/{job.id}", headers=w.h("viewer")).json()["checkpoint_advice"]  # the job's detail
    assert shown["summary"] == advice.summary and shown["failures"] == 3 and not shown["from_prior"]
    listed = client.get("/v1/jobs", headers=w.h("viewer")).json()["items"]
    assert all("checkpoint_advice" not in j for j in listed)  # the list stays as it was
