"""A forced Redis redelivery is refused by the fencing token; a cancel checkpoints and stops.

Real PostgreSQL, real Redis, real worker processes and the real trainer on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from core.models import Attempt, Checkpoint, Event, Job
from core.settings import get_settings
from core.states import JobState
from core.trainer_protocol import ExitCode
from core.transitions import record_event
from harness.workers_cluster import Cluster, cluster_on_new_database, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import job_events, job_row
from workers.dispatch import dispatch_attempt

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def one_host(tmp_path: Path) -> Iterator[Cluster]:
    # Visibility timeout 2 s: Redis hands an unacknowledged message out again after 2 s.
    with cluster_on_new_database(tmp_path, "kiln_delivery", lease_s=8.0, visibility_timeout_s=2.0) as c:
        yield c


def test_forced_redelivery_is_refused_and_exactly_one_attempt_trains(one_host: Cluster) -> None:
    c = one_host
    # A message is acknowledged once its claim is committed; the worker holds each delivery 4 s before claiming
    # (a test hook), longer than the visibility timeout, so Redis hands the same message out a second time.
    host = c.start_worker("a", cpu_slots=1, hooks={**slow_steps(0.25), "hold_delivery_s": 4.0})
    maker = c.sessionmaker()
    job_id = c.submit_job(tiny_spec("redelivered", steps=60))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, job_id).state == "RUNNING", 60, "running")
        # Redis redelivers the unacknowledged message (visibility timeout 2 s) while the first delivery is held.
        refused = wait_for(lambda: job_events(c, job_id, "DELIVERY_REFUSED"), 60, "the redelivery refused")
        # And a message carrying a token that was never current for this attempt: refused as stale.
        with maker() as db:
            attempt = db.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        dispatch_attempt(attempt.id, attempt.fencing_token - 1, attempt.placement)
        wait_for(
            lambda: any("stale fencing token" in e.message for e in job_events(c, job_id, "DELIVERY_REFUSED")),
            30,
            "stale token refused",
        )
        wait_for(lambda: job_row(c, job_id).state in ("SUCCEEDED", "FAILED"), 120, "finished")
    finally:
        sched.stop()

    job = job_row(c, job_id)
    assert job.state == "SUCCEEDED", job.exit_reason
    assert "already started by delivery" in refused[0].message
    assert refused[0].data["host"] == host
    with maker() as db:
        attempts = db.scalars(select(Attempt).where(Attempt.job_id == job_id)).all()
        running = db.scalars(select(Event).where(Event.job_id == job_id, Event.type == "RUNNING")).all()
    assert len(attempts) == 1 and attempts[0].state == "SUCCEEDED"
    assert len(running) == 1
    log = (get_settings().resolved_storage_dir / "logs" / str(job_id) / "1.log").read_text()
    assert log.count("launching:") == 1, "exactly one trainer was started"
    run_dir = get_settings().resolved_storage_dir / "runs" / str(job_id)
    assert [p.name for p in run_dir.iterdir()] == ["1"]
    # One training run: steps 1..60 once each in the telemetry of the only rank.
    steps = [
        line
        for line in (run_dir / "1" / "telemetry" / "rank0.jsonl").read_text().splitlines()
        if '"kind":"step"' in line
    ]
    assert len(steps) == 60


def test_cancel_running_job_checkpoints_and_is_cancelled_within_grace(one_host: Cluster) -> None:
    c = one_host
    c.start_worker("a", cpu_slots=1, hooks=slow_steps(0.1))
    maker = c.sessionmaker()
    job_id = c.submit_job(tiny_spec("cancelled", steps=400, every_steps=100))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, job_id).last_step >= 15, 90, "training under way")
        with maker() as db:  # what the API's cancel does for a running job
            job = db.get(Job, job_id)
            assert job is not None and job.state == JobState.RUNNING
            job.cancel_requested = True
            record_event(db, "CANCEL_REQUESTED", job=job, message="cancel requested")
            db.commit()
        wait_for(lambda: job_row(c, job_id).state == "CANCELLED", get_settings().stop_grace_s + 30, "cancelled")
    finally:
        sched.stop()

    job = job_row(c, job_id)
    log = (get_settings().resolved_storage_dir / "logs" / str(job_id) / "1.log").read_text()
    timeline = "\n".join(f"{e.created_at:%H:%M:%S.%f} {e.type}: {e.message}" for e in job_events(c, job_id))
    story = f"\n--- events\n{timeline}\n--- attempt log (steps left out)\n" + "\n".join(
        line for line in log.splitlines() if '"kind":"step"' not in line
    )
    # Within the grace: the trainer stopped itself (no SIGKILL), having committed a checkpoint of the step it
    # stopped at, and exited PREEMPTED. How long that took is the benchmarks' business, not this test's.
    assert "cancel requested" in log, story
    assert "grace period over" not in log, story
    assert job.finished_at is not None
    with maker() as db:
        attempt = db.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        steps = db.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)).all()
    assert attempt.state == "CANCELLED" and attempt.exit_code == ExitCode.PREEMPTED, story
    assert job.last_step in steps and 15 <= job.last_step < 100, (job.last_step, steps, story)
