"""What the worker records when an attempt ends, against a real PostgreSQL (a rolled-back transaction per test):
the job's result is what its checkpoints hold."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.lifecycle import ExitClass, requeue_after_failure
from core.models import Attempt, Checkpoint, Event, Host, Job
from core.settings import Settings
from core.transitions import hold
from harness.workers_cluster import admit, submit, tiny_spec
from workers.claim import claim
from workers.claimed import Claimed
from workers.exit_classes import Outcome, StopRequest
from workers.host_agent import HostAgent
from workers.inventory import NoGpus
from workers.runner import AttemptRunner
from workers.supervisor import TrainerProcess
from workers.telemetry_relay import RelayState, relay

pytestmark = pytest.mark.integration

SETTINGS = Settings(lease_s=10.0, heartbeat_interval_s=1.0)


def _checkpoint(step: int, loss: float, **kw: Any) -> dict[str, Any]:
    return {
        "kind": "checkpoint",
        "rank": 0,
        "ts": time.time(),
        "step": step,
        "path": f"/c/step_{step:08d}",
        "bytes": 100,
        "sha256": f"{step:064d}",
        "verified": True,
        "loss": loss,
        **kw,
    }


def _claimed(db: Session, host_name: str, job_name: str) -> tuple[Host, Job, Attempt, Claimed]:
    """A job admitted on a new host and its attempt claimed, as a worker does before it launches the trainer."""
    host = HostAgent(name=host_name, inventory=NoGpus(), cpu_slots=2, address="127.0.0.1", settings=SETTINGS).register(
        db
    )
    db.flush()
    job = submit(db, tiny_spec(job_name, steps=60))
    attempt = admit(db, job, host)
    claimed = claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=SETTINGS,
    )
    return host, job, attempt, claimed


def test_a_resume_that_trains_no_step_records_its_checkpoints_step_and_loss(db: Session, tmp_path: Path) -> None:
    host, job, first, _ = _claimed(db, "rep-a", "resumed-at-the-end")
    # The first attempt relayed two checkpoints and a step past them; its worker froze, its trainer committed
    # step 60 - the end - before its lease ran out, and the attempt was declared lost.
    steps = [{"kind": "step", "rank": 0, "ts": time.time(), "step": 25, "loss": 3.0}]
    relay(db, job=job, attempt=first, state=RelayState(), records=[_checkpoint(10, 4.0), _checkpoint(20, 3.5), *steps])
    requeue_after_failure(
        db,
        job=job,
        attempt=first,
        reason="lease expired",
        now=utcnow(),
        settings=SETTINGS.model_copy(update={"storage_dir": tmp_path}),
    )
    assert job.last_step == 25 and job.state == "QUEUED"

    second = admit(db, job, host)
    claimed = claim(
        db,
        attempt_id=second.id,
        token=second.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d2",
        settings=SETTINGS,
    )
    proc = TrainerProcess([], env={}, log_path=tmp_path / "2.log", run_dir=tmp_path / "run", cwd=tmp_path)
    runner = AttemptRunner(
        attempt_id=second.id,
        token=second.fencing_token,
        node_rank=0,
        host=host.name,
        settings=SETTINGS,
        claimed=claimed,
        proc=proc,
    )
    # It resumed from the lost attempt's final checkpoint, had no step left to train, and finished.
    created = time.time() - 30
    runner.buffer = [
        {
            "kind": "resumed",
            "rank": 0,
            "ts": time.time(),
            "step": 60,
            "loss": 2.5,
            "token": first.fencing_token,
            "path": "/c/step_00000060",
            "bytes": 100,
            "sha256": "f" * 64,
            "created": created,
            "tier": "durable",
        }
    ]
    runner.relay_state.done = {"kind": "done", "rank": 0, "steps": 60, "final_loss": 2.5}
    runner._report(db, Outcome(ExitClass.SUCCEEDED, "succeeded"), 0)

    assert job.state == "SUCCEEDED" and (job.last_step, job.last_loss) == (60, 2.5)
    done = db.scalars(select(Event).where(Event.job_id == job.id, Event.type == "SUCCEEDED")).one()
    assert done.data["final_loss"] == 2.5 and done.data["last_step"] == 60
    rows = {r.step: r for r in db.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id))}
    assert sorted(rows) == [10, 20, 60]  # 60, never relayed by its writer, is where the job's state comes from
    assert rows[60].attempt_id == first.id and rows[60].sha256 == "f" * 64
    assert rows[60].created_at.timestamp() == pytest.approx(created)
    assert second.resumed_from_step == 60


def test_rows_past_a_resume_or_a_rollback_are_forgotten(db: Session) -> None:
    host = HostAgent(name="rep-b", inventory=NoGpus(), cpu_slots=2, address="127.0.0.1", settings=SETTINGS).register(db)
    db.flush()
    job = submit(db, tiny_spec("rolled-back", steps=60))
    attempt = admit(db, job, host)
    state = RelayState()
    relay(db, job=job, attempt=attempt, state=state, records=[_checkpoint(s, 4.0 - s / 100) for s in (10, 20, 30)])
    # The newest failed verification: the trainer resumed from 20, and the row of 30 describes nothing usable.
    resumed = {"kind": "resumed", "rank": 0, "ts": time.time(), "step": 20, "loss": 3.8, "tier": "durable"}
    relay(db, job=job, attempt=attempt, state=state, records=[resumed])
    assert sorted(db.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job.id))) == [10, 20]
    assert (job.last_step, job.last_loss) == (20, 3.8)
    rolled = {
        "kind": "event",
        "rank": 0,
        "ts": time.time(),
        "type": "ROLLED_BACK",
        "message": "rolled back",
        "fields": {"to_step": 10, "removed_checkpoints": [20]},
    }
    relay(db, job=job, attempt=attempt, state=state, records=[rolled])
    assert sorted(db.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job.id))) == [10]


def test_a_report_whose_commit_failed_relays_its_final_checkpoint_again(db: Session, tmp_path: Path) -> None:
    """The chaos test's PostgreSQL stop hit an attempt's final report at its commit: the retry found the telemetry
    buffer already emptied and the final checkpoint, verified on disk, was never listed."""
    host = HostAgent(
        name="rep-retry", inventory=NoGpus(), cpu_slots=1, address="127.0.0.1", settings=SETTINGS
    ).register(db)
    db.flush()
    job = submit(db, tiny_spec("retried-report", steps=60))
    attempt = admit(db, job, host)
    claimed = claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=SETTINGS,
    )
    proc = TrainerProcess([], env={}, log_path=tmp_path / "1.log", run_dir=tmp_path / "run", cwd=tmp_path)
    runner = AttemptRunner(
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        settings=SETTINGS,
        claimed=claimed,
        proc=proc,
    )
    runner.buffer = [_checkpoint(60, 2.0)]
    runner.relay_state.done = {"kind": "done", "rank": 0, "steps": 60, "final_loss": 2.0}
    failed = db.begin_nested()
    runner._report(db, Outcome(ExitClass.SUCCEEDED, "succeeded"), 0)
    failed.rollback()  # the commit did not happen
    runner._report(db, Outcome(ExitClass.SUCCEEDED, "succeeded"), 0)  # the retry
    assert job.state == "SUCCEEDED" and (job.last_step, job.last_loss) == (60, 2.0)
    assert [r.step for r in db.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id))] == [60]


def test_a_gang_succeeds_with_the_result_of_the_node_that_ran_rank_0(db: Session, tmp_path: Path) -> None:
    """Global ranks are assigned at the rendezvous, not by node: rank 0 (whose final record is the job's step and
    loss) ran on node 1 in the gang e2e test. Node 0 reporting its success first must not end the job with the
    last step a heartbeat happened to relay."""
    from scheduler.live.apply import apply_all
    from scheduler.policy.decisions import Admission, Decisions, PlacementEntry

    hosts = [
        HostAgent(
            name=f"rep-gang-{i}", inventory=NoGpus(), cpu_slots=1, address="127.0.0.1", settings=SETTINGS
        ).register(db)
        for i in range(2)
    ]
    db.flush()
    spec = {**tiny_spec("gang", steps=40), "resources": {"gpus": 0, "cpu_slots": 2}}
    job = submit(db, spec)
    entries = tuple(
        PlacementEntry(host=h.name, queue=h.queue, gpus=(), slots=1, node_rank=i) for i, h in enumerate(hosts)
    )
    assert apply_all(db=db, decisions=Decisions(admissions=(Admission(job.id, entries),)), now=utcnow()).admitted
    attempt = job.attempts[-1]
    runners = []
    for i, h in enumerate(hosts):
        claimed = claim(
            db,
            attempt_id=attempt.id,
            token=attempt.fencing_token,
            node_rank=i,
            host=h.name,
            delivery=f"d{i}",
            settings=SETTINGS,
        )
        proc = TrainerProcess([], env={}, log_path=tmp_path / f"{i}.log", run_dir=tmp_path / f"run{i}", cwd=tmp_path)
        runners.append(
            AttemptRunner(
                attempt_id=attempt.id,
                token=attempt.fencing_token,
                node_rank=i,
                host=h.name,
                settings=SETTINGS,
                claimed=claimed,
                proc=proc,
            )
        )
    # A heartbeat of node 1 relayed rank 0's step 38; then both ranks finished. Node 0 (rank 1) reports first.
    relay(
        db,
        job=job,
        attempt=attempt,
        state=runners[1].relay_state,
        records=[{"kind": "step", "rank": 0, "ts": time.time(), "step": 38, "loss": 2.2}],
    )
    runners[0]._report(db, Outcome(ExitClass.SUCCEEDED, "succeeded"), 0)
    assert job.state == "RUNNING" and attempt.state == "RUNNING", "decided by the node without rank 0's result"

    runners[1].relay_state.done = {"kind": "done", "rank": 0, "steps": 40, "final_loss": 2.0}
    runners[1]._report(db, Outcome(ExitClass.SUCCEEDED, "succeeded"), 0)
    assert job.state == "SUCCEEDED" and attempt.state == "SUCCEEDED"
    assert (job.last_step, job.last_loss) == (40, 2.0)


def _cancel(db: Session, job: Job, runner: AttemptRunner) -> Outcome:
    job.cancel_requested = True  # what POST /v1/jobs/{id}/cancel does to a running job
    return Outcome(ExitClass.CANCELLED, "cancel requested")


def _hold(db: Session, job: Job, runner: AttemptRunner) -> Outcome:
    hold(db, job, by="alice", reason=None, actor_user_id=None, now=utcnow())  # what POST /v1/jobs/{id}/hold does
    return Outcome(ExitClass.PREEMPTED, "held by the user")


def _time_limit(db: Session, job: Job, runner: AttemptRunner) -> Outcome:
    runner.stop = StopRequest(ExitClass.TIMEOUT, "time limit reached")  # the worker's own deadline passed
    return Outcome(ExitClass.TIMEOUT, "timeout: time limit reached")


@pytest.mark.parametrize(
    ("stop", "cause", "state"),
    [
        (_cancel, "cancelled by the user", "CANCELLED"),
        (_hold, "held by alice", "QUEUED"),
        (_time_limit, "time limit reached", "FAILED"),
    ],
    ids=["cancel", "hold", "time-limit"],
)
def test_a_stop_that_was_not_the_schedulers_preemption_never_says_preempted(
    db: Session, tmp_path: Path, stop: Callable[[Session, Job, AttemptRunner], Outcome], cause: str, state: str
) -> None:
    """The trainer calls every SIGTERM stop PREEMPTED (it cannot know why); a user's cancel or hold, and the
    worker's own stops (the time limit, a hang, its shutdown), are what the job's timeline says (the H200 run of
    bench/gpu_path_bench.py showed PREEMPTED for a hold)."""
    host, job, attempt, claimed = _claimed(db, "rep-stop", "stopped-running")
    proc = TrainerProcess([], env={}, log_path=tmp_path / "1.log", run_dir=tmp_path / "run", cwd=tmp_path)
    runner = AttemptRunner(
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        settings=SETTINGS,
        claimed=claimed,
        proc=proc,
    )
    outcome = stop(db, job, runner)
    now = time.time()
    runner.buffer = [
        {
            "kind": "event",
            "rank": 0,
            "ts": now,
            "type": "PREEMPTED",
            "message": "signal 15: checkpointed step 17, exiting",
            "fields": {"step": 17, "signal": 15},
        },
        {
            "kind": "event",
            "rank": 0,
            "ts": now,
            "type": "EXIT",
            "message": "exiting with 75 (PREEMPTED)",
            "fields": {"exit_code": 75, "reason": "PREEMPTED"},
        },
    ]
    runner._report(db, outcome, 75)

    assert job.state == state
    timeline = [(e.type, e.message) for e in db.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id))]
    assert "PREEMPTED" not in [t for t, _ in timeline], timeline
    assert ("STOPPING", f"signal 15: checkpointed step 17, exiting ({cause})") in timeline
    assert ("EXIT", f"exiting with 75 (stopped: {cause})") in timeline
    if state == "CANCELLED":
        assert job.exit_reason == cause and timeline[-1][1].startswith("cancelled by the user at step")
    if state == "QUEUED":
        assert job.held_at is not None and job.pending_reason == "Held"


def test_a_lost_attempt_dates_the_jobs_timeline_by_the_callers_clock(db: Session, tmp_path: Path) -> None:
    """The reconciler declares an attempt lost at its cycle's time: the LOST and QUEUED events, the wait that
    starts and the attempt's end all carry that time, not the wall clock of the moment the code ran."""
    _, job, first, _ = _claimed(db, "rep-clock", "lost-at-the-cycle")
    cycle = utcnow() - timedelta(minutes=5)
    requeue_after_failure(
        db,
        job=job,
        attempt=first,
        reason="lease expired",
        now=cycle,
        settings=SETTINGS.model_copy(update={"storage_dir": tmp_path}),
    )
    events = {e.type: e for e in db.scalars(select(Event).where(Event.job_id == job.id))}
    assert events["LOST"].created_at == cycle and events["QUEUED"].created_at == cycle
    assert job.updated_at == cycle and first.ended_at == cycle
    assert job.wait_started_at == job.not_before  # the backoff counted from the cycle's time
    assert job.not_before is not None and job.not_before > cycle
