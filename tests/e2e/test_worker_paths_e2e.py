"""The worker's other ways of ending an attempt, and the scheduler's wake-up, each walked end to end.

Real PostgreSQL and Redis, real worker processes as hosts, the trainer on CPU, the real scheduler:

- a preemption the scheduler's ``plan()`` decides: the worker stops the trainer, which checkpoints on SIGTERM;
  the job goes back to the queue with its progress (no restart counted), resumes from that checkpoint and ends
  with the loss of an uninterrupted twin;
- a hold on a running job: the same stop, then the job waits held until released, and resumes;
- a submit through the API (uvicorn) wakes ``python -m scheduler`` through PostgreSQL's NOTIFY: its timer is an
  hour, so only the notification can have admitted the job;
- the time limit: stopped, checkpointed, FAILED with the reason; the recorded step is its checkpoint's;
- a hang (the training loop stuck, its heartbeat thread ticking on): stopped, and restarted elsewhere;
- a worker's warm shutdown (SIGTERM): its attempts checkpoint and go back to the queue (DRAINED), and resume;
- a worker frozen in the middle of a transaction (its host's and its job's rows locked): PostgreSQL ends the idle
  transaction, so the reconciler still declares the attempt LOST instead of waiting for it with the whole scheduler.

The lease expiring while a trainer is alive (the worker's fenced stop) is walked in ``test_failover_zombie.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.db import session_scope
from core.models import Attempt
from core.policy_config import PolicyConfig
from core.services import jobs as jobs_service
from core.services.bootstrap import bootstrap_admin
from core.settings import get_settings
from harness.workers_cluster import (
    ROOT,
    Cluster,
    cluster_admin,
    cluster_on_new_database,
    slow_steps,
    tiny_spec,
    wait_for,
)
from tests.support.cluster_rows import checkpoint_manifests, finished_state, job_attempts, job_events, job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_paths", lease_s=8.0) as c:
        yield c


def _spec(name: str, *, steps: int = 60, every_steps: int = 20, qos: str = "silver", **extra: Any) -> dict[str, Any]:
    spec = tiny_spec(name, steps=steps, every_steps=every_steps)
    spec["checkpointing"]["keep_last"] = 100  # every checkpoint stays on disk, to be checked
    spec["sla"] = {"qos": qos}
    return {**spec, **extra}


def _wait_final(c: Cluster, *job_ids: int, timeout: float = 180) -> None:
    for j in job_ids:
        wait_for(lambda j=j: finished_state(c, j), timeout, f"job {j} finished")


def _resumed_from_its_stop_checkpoint(c: Cluster, job_id: int, stopped_state: str) -> tuple[Attempt, Attempt]:
    """The job stopped once (``stopped_state``) and ran again from the checkpoint the stopped attempt wrote last;
    its recorded result is its final checkpoint's."""
    first, second = job_attempts(c, job_id)
    assert (first.state, second.state) == (stopped_state, "SUCCEEDED"), (first.exit_reason, second.exit_reason)
    manifests = checkpoint_manifests(job_id)
    by_first = [s for s, m in manifests.items() if m["fencing_token"] == first.fencing_token]
    assert by_first and second.resumed_from_step == max(by_first)
    job = job_row(c, job_id)
    final = manifests[max(manifests)]
    assert job.last_step == max(manifests) and job.last_loss == pytest.approx(final["loss"], abs=1e-9)
    return first, second


# ------------------------------------------------------------------------------------------------ preemption


def test_a_preemption_checkpoints_requeues_and_resumes_with_the_twins_loss(hosts: Cluster) -> None:
    c = hosts
    slow = slow_steps(0.15)
    c.start_worker("a", hooks=slow)
    c.start_worker("b", hooks=slow)
    # Two bronze jobs, one per host, the same spec: whichever the policy preempts, the other is its twin.
    low = [c.submit_job(_spec(f"low-{i}", qos="bronze")) for i in (1, 2)]
    # No minimum run time and no patience: a gold job that finds no room preempts at once.
    config = PolicyConfig(min_run_time_s=0.0, preempt_patience_s=None)
    sched = c.scheduler_thread(config=config)
    try:
        wait_for(lambda: all(job_row(c, j).last_step >= 5 for j in low), 120, "both bronze jobs training")
        gold = c.submit_job(_spec("gold", steps=10, every_steps=10, qos="gold", seed=7))
        victim = wait_for(
            lambda: next((j for j in low if job_events(c, j, "PREEMPTING")), None), 60, "a bronze job preempted"
        )
        _wait_final(c, gold, *low)
    finally:
        sched.stop()
    (twin,) = [j for j in low if j != victim]
    assert job_row(c, gold).state == "SUCCEEDED"
    first, _second = _resumed_from_its_stop_checkpoint(c, victim, "PREEMPTED")
    job = job_row(c, victim)
    assert job.restart_count == 0, "a preemption is not a restart"
    assert not job_events(c, victim, "LOST")
    # The trainer checkpointed when it was told to stop, at the step it had reached (not only at every 20 steps).
    queued = [e for e in job_events(c, victim, "QUEUED") if "preempted at step" in e.message]
    assert queued and queued[0].data["last_step"] == job_attempts(c, victim)[1].resumed_from_step
    assert "preemption requested by the scheduler" in _log(victim, 1)
    # The preemptor ran in the room the victim left.
    (gold_attempt,) = job_attempts(c, gold)
    assert first.ended_at is not None and gold_attempt.started_at is not None
    assert gold_attempt.placement[0]["host"] == first.placement[0]["host"]
    ref = job_row(c, twin)
    assert ref.state == "SUCCEEDED" and len(job_attempts(c, twin)) == 1
    assert job.last_loss == pytest.approx(ref.last_loss, rel=1e-6, abs=1e-6)


def test_a_running_job_held_checkpoints_waits_held_and_resumes_once_released(hosts: Cluster) -> None:
    """kiln hold on a running job (Slurm's requeuehold): the worker stops it as for a preemption, the trainer
    checkpoints on SIGTERM, and the job waits in the queue held, its host idle, until it is released; then it
    resumes from that checkpoint and succeeds."""
    c = hosts
    c.start_worker("a", hooks=slow_steps(0.15))
    job_id = c.submit_job(_spec("held-while-running"))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, job_id).last_step >= 5, 120, "the job training")
        with c.sessionmaker()() as db:
            jobs_service.hold(db=db, principal=cluster_admin(db), job_id=job_id, reason="e2e")
            db.commit()
        wait_for(lambda: job_row(c, job_id).state == "QUEUED", 60, "the job back in the queue")
        time.sleep(3)  # six scheduler cycles with the host idle
        job = job_row(c, job_id)
        assert (job.state, job.pending_reason, len(job_attempts(c, job_id))) == ("QUEUED", "Held", 1)
        with c.sessionmaker()() as db:
            jobs_service.release(db=db, principal=cluster_admin(db), job_id=job_id)
            db.commit()
        _wait_final(c, job_id)
    finally:
        sched.stop()
    assert job_row(c, job_id).state == "SUCCEEDED"
    _resumed_from_its_stop_checkpoint(c, job_id, "PREEMPTED")
    assert job_row(c, job_id).restart_count == 0 and not job_events(c, job_id, "PREEMPTING")
    assert [e.type for e in job_events(c, job_id, "HOLD_REQUESTED")] == ["HOLD_REQUESTED"]
    assert "held by the user" in _log(job_id, 1)


def _log(job_id: int, attempt: int) -> str:
    return (get_settings().resolved_storage_dir / "logs" / str(job_id) / f"{attempt}.log").read_text()


# ------------------------------------------------------------------------------------------- NOTIFY wake-up


def test_a_submit_through_the_api_wakes_the_scheduler_through_notify(hosts: Cluster, tmp_path: Path) -> None:
    c = hosts
    with session_scope() as db:
        _admin, token = bootstrap_admin(db=db, name="admin")
    c.start_worker("a", cpu_slots=2)
    alive = tmp_path / "scheduler.alive"
    # An hour between timed cycles: within this test only a NOTIFY can make the scheduler run a cycle.
    c.start_scheduler("scheduler", interval_s=3600.0, KILN_LIVENESS_FILE=str(alive))
    wait_for(
        lambda: alive.exists() and json.loads(alive.read_text())["state"] == "leading",
        90,
        "the scheduler leading, its first cycle committed",
    )
    api = c.start_api()
    r = httpx.post(
        f"{api}/v1/jobs",
        json=_spec("through-the-api", steps=10, every_steps=10),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    admitted = wait_for(lambda: job_events(c, job_id, "ADMITTED"), 60, "the job admitted")[0]
    submitted = job_events(c, job_id, "SUBMITTED")[0]
    latency = (admitted.created_at - submitted.created_at).total_seconds()
    print(f"submit -> ADMITTED through NOTIFY: {latency:.2f} s (timer: 3600 s)")
    _wait_final(c, job_id, timeout=120)
    assert job_row(c, job_id).state == "SUCCEEDED"


# ------------------------------------------------------------------------------------------------ time limit


def test_the_time_limit_stops_checkpoints_and_fails_with_the_reason(hosts: Cluster) -> None:
    c = hosts
    c.start_worker("a", hooks=slow_steps(0.15))
    # 3,000 steps at >= 0.15 s each cannot end within 40 s.
    job_id = c.submit_job(_spec("over-time", steps=3000, every_steps=1000, time_limit_s=40))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, job_id).last_step > 0, 120, "training under way")
        _wait_final(c, job_id)
    finally:
        sched.stop()
    job = job_row(c, job_id)
    assert job.state == "FAILED", job.exit_reason
    assert (job.exit_reason or "").startswith("timeout: time limit reached"), job.exit_reason
    (attempt,) = job_attempts(c, job_id)
    assert attempt.state == "FAILED" and job.restart_count == 0
    assert "time limit reached" in _log(job_id, 1)
    # Told to stop, the trainer committed a checkpoint at the step it had reached: that is the job's record.
    manifests = checkpoint_manifests(job_id)
    assert manifests and max(manifests) == job.last_step and 0 < job.last_step < 1000
    assert job.last_loss == pytest.approx(manifests[job.last_step]["loss"], abs=1e-9)


def _ran_s(c: Cluster, job_id: int) -> float:
    (attempt,) = job_attempts(c, job_id)
    assert attempt.started_at is not None
    return time.time() - attempt.started_at.timestamp()


def test_a_time_limit_changed_while_the_job_runs_is_the_one_its_worker_keeps(hosts: Cluster) -> None:
    """kiln update on a running job: raised, the worker lets it run past its first limit; lowered, the worker stops
    it at the new one (checkpoint first), long before the scheduler's backstop (60 s past the limit)."""
    c = hosts
    c.start_worker("a", hooks=slow_steps(0.15))
    job_id = c.submit_job(_spec("limit-changed", steps=3000, every_steps=1000, time_limit_s=20))

    def set_limit(seconds: float) -> None:
        with session_scope() as db:
            jobs_service.update(db=db, principal=cluster_admin(db), job_id=job_id, time_limit_s=seconds)

    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, job_id).state == "RUNNING", 120, "the job running")
        set_limit(600)
        wait_for(lambda: _ran_s(c, job_id) > 30, 60, "the attempt past its first limit")
        assert job_row(c, job_id).state == "RUNNING" and job_row(c, job_id).last_step > 0
        set_limit(round(_ran_s(c, job_id)) + 5)
        _wait_final(c, job_id)
    finally:
        sched.stop()
    job = job_row(c, job_id)
    assert job.state == "FAILED" and (job.exit_reason or "").startswith("timeout: time limit reached"), job.exit_reason
    assert not job_events(c, job_id, "TIME_LIMIT")  # the worker's stop, not the scheduler's backstop (its event)
    log = _log(job_id, 1)
    assert "time limit now 600 s" in log and "time limit reached" in log
    assert [e.message.split(" (by")[0] for e in job_events(c, job_id, "UPDATED")][0] == "time_limit 20 s -> 600 s"


# ------------------------------------------------------------------------------------------------------ hang


def test_a_hung_trainer_is_stopped_and_its_job_restarts_elsewhere(hosts: Cluster) -> None:
    c = hosts
    slow = slow_steps(0.15)
    healthy = c.start_worker("b", hooks=slow)
    sched = c.scheduler_thread()
    try:
        twin = c.submit_job(_spec("twin", every_steps=10))
        wait_for(lambda: job_row(c, twin).state == "RUNNING", 90, "the twin running on the healthy host")
        # On this host the training loop hangs after step 12 for good while its heartbeat thread ticks on.
        stuck = c.start_worker("a", hooks={**slow, "hang_at_step": 12}, KILN_HANG_TIMEOUT_S="5")
        victim = c.submit_job(_spec("victim", every_steps=10))
        lost = wait_for(lambda: job_events(c, victim, "LOST"), 150, "the hung attempt stopped and LOST")[0]
        _wait_final(c, victim, twin)
    finally:
        sched.stop()
    assert "no training progress for 5 s: hung" in lost.message, lost.message
    first, second = _resumed_from_its_stop_checkpoint(c, victim, "LOST")
    assert first.placement[0]["host"] == stuck and second.placement[0]["host"] == healthy
    assert second.resumed_from_step == 10  # the hang came after step 12; the last checkpoint was step 10
    assert job_row(c, victim).last_loss == pytest.approx(job_row(c, twin).last_loss, rel=1e-6, abs=1e-6)


# ------------------------------------------------------------------------------------------- shutdown drain


def test_a_worker_shutting_down_drains_its_attempts_back_to_the_queue(hosts: Cluster) -> None:
    c = hosts
    slow = slow_steps(0.15)
    names = [c.start_worker("a", hooks=slow), c.start_worker("b", hooks=slow)]
    drained, twin = c.submit_job(_spec("drained")), c.submit_job(_spec("twin"))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: all(job_row(c, j).last_step >= 5 for j in (drained, twin)), 120, "both training")
        host = job_attempts(c, drained)[0].placement[0]["host"]
        assert host in names
        worker = c.workers[host]
        os.kill(worker.pid, signal.SIGTERM)  # what systemd, compose or Ctrl-C sends: a warm shutdown
        assert worker.wait(90) == 0
        first = job_attempts(c, drained)[0]
        assert first.state == "DRAINED", (first.state, first.exit_reason)
        assert job_row(c, drained).state in ("QUEUED", "ADMITTED", "RUNNING", "SUCCEEDED")
        c.start_worker(host.rsplit("-", 1)[0], hooks=slow)  # its supervisor brings it back
        _wait_final(c, drained, twin)
    finally:
        sched.stop()
    _resumed_from_its_stop_checkpoint(c, drained, "DRAINED")
    job = job_row(c, drained)
    assert job.restart_count == 0 and not job_events(c, drained, "LOST")
    assert any("drained at step" in e.message for e in job_events(c, drained, "QUEUED"))
    assert "the worker is shutting down" in _log(drained, 1)
    assert job.last_loss == pytest.approx(job_row(c, twin).last_loss, rel=1e-6, abs=1e-6)


# ------------------------------------------------------------------------------- frozen inside a transaction

# What a worker SIGSTOPped in the middle of its host heartbeat or an attempt's heartbeat leaves in PostgreSQL: a
# transaction holding its host's row and its job's row, open for as long as the process is frozen.
FROZEN_IN_A_TRANSACTION = """
import os, signal, sys
from sqlalchemy import text
from core.db import get_sessionmaker
db = get_sessionmaker()()
db.execute(text("SELECT id FROM hosts FOR UPDATE"))
db.execute(text("SELECT id FROM jobs WHERE id = :j FOR UPDATE"), {"j": int(sys.argv[1])})
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_worker_frozen_inside_a_transaction_does_not_hold_up_the_scheduler(hosts: Cluster) -> None:
    c = hosts
    host = c.start_worker("a", hooks=slow_steps(0.15))
    job_id = c.submit_job(_spec("frozen-mid-transaction", every_steps=10))
    sched = c.scheduler_thread()
    frozen = [c.workers[host].pid]
    locker: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: job_row(c, job_id).last_step >= 5, 120, "training under way")
        frozen += c.trainer_pids(host)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        locker = subprocess.Popen(
            [sys.executable, "-c", FROZEN_IN_A_TRANSACTION, str(job_id)], env=c.env, cwd=ROOT, stdout=subprocess.PIPE
        )
        assert locker.stdout is not None and locker.stdout.readline().strip() == b"locked"
        # The reconciler locks every host row, then the job it ends: it must not wait for the frozen transaction.
        lost = wait_for(lambda: job_events(c, job_id, "LOST"), 90, "the frozen attempt declared LOST")[0]
    finally:
        if locker is not None:
            locker.kill()
            locker.wait(10)
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        sched.stop()
    assert "lease expired" in lost.message, lost.message
