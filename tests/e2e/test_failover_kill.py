"""SIGKILL a worker and its training processes mid-run; the job fails over and finishes.

Real PostgreSQL, real Redis, two `python -m workers` processes as two hosts, the real trainer on CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from core.db import utcnow
from core.models import Checkpoint, Event, Usage
from core.settings import get_settings
from harness.workers_cluster import Cluster, cluster_on_new_database, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import finished_state, job_attempts, job_events, job_row, matched_its_twin

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LEASE_S = 8.0


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_failover", lease_s=LEASE_S) as c:
        yield c


def test_sigkill_worker_fails_over_and_matches_uninterrupted_run(two_hosts: Cluster) -> None:
    c = two_hosts
    host_a = c.start_worker("a", cpu_slots=1, hooks=slow_steps(0.15))
    maker = c.sessionmaker()
    wait_for(lambda: len(_hosts_up(c)) == 1, 60, "host a registered")
    spec = tiny_spec("victim", steps=60, every_steps=10)
    victim = c.submit_job(spec, recovery_objective_s=60.0)
    sched = c.scheduler_thread()
    try:
        # The real scheduler places the victim on a (the only host); host b comes up next and the reference, same
        # spec, lands there (a is full): an uninterrupted twin.
        wait_for(lambda: job_row(c, victim).state == "RUNNING", 60, "victim running")
        host_b = c.start_worker("b", cpu_slots=2, hooks=slow_steps(0.15))
        wait_for(lambda: len(_hosts_up(c)) == 2, 60, "host b registered")
        reference = c.submit_job({**spec, "name": "reference"})
        first = job_attempts(c, victim)[0]
        assert first.placement[0]["host"] == host_a

        # Mid-run, after at least one verified checkpoint and a few steps beyond it.
        wait_for(lambda: job_row(c, victim).last_step >= 25, 90, "victim past step 25")
        with maker() as db:
            ckpt_before = max(db.scalars(select(Checkpoint.step).where(Checkpoint.job_id == victim)).all())
        trainers = c.trainer_pids(host_a)
        assert trainers, "the worker should be running torchrun and a rank"
        killed_at = utcnow()
        c.kill_worker(host_a)

        def gone(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        # SIGKILL is delivered asynchronously: give the kernel a moment, not the trainer a chance.
        wait_for(lambda: all(gone(p) for p in trainers), 5, "torchrun and the rank dead")
        # How far the killed trainer got: its own telemetry, not the database's last_step, which the worker
        # relays a heartbeat late (the trainer may have committed one more checkpoint than the database shows).
        telemetry = get_settings().resolved_storage_dir / "runs" / str(victim) / str(first.number) / "telemetry"
        complete = (telemetry / "rank0.jsonl").read_text().split("\n")[:-1]  # a SIGKILL may cut the last line
        step_at_kill = max(json.loads(line)["step"] for line in complete if '"kind":"step"' in line)

        wait_for(lambda: finished_state(c, victim), 150, "victim finished after failover")
        wait_for(lambda: finished_state(c, reference), 60, "reference finished")
        wait_for(lambda: job_events(c, victim, "RECOVERED"), 20, "recovery time recorded")
    finally:
        sched.stop()

    # Resumed from the last verified checkpoint: same data position, RNG and optimizer state -> the same loss.
    matched_its_twin(c, victim, reference, steps=60)

    attempts = job_attempts(c, victim)
    assert [a.state for a in attempts] == ["LOST", "SUCCEEDED"]
    second = attempts[1]
    assert second.placement[0]["host"] == host_b
    assert second.resumed_from_step is not None and second.resumed_from_step >= ckpt_before
    assert second.resumed_from_step <= step_at_kill
    assert step_at_kill - second.resumed_from_step <= spec["checkpointing"]["every_steps"] + 5
    # Never two attempts at once: the second started only after the first was declared lost.
    assert attempts[0].ended_at is not None and second.started_at is not None
    assert second.started_at >= attempts[0].ended_at

    lost = job_events(c, victim, "LOST")
    assert len(lost) == 1
    # Declared LOST by its lease, and not before the lease (renewed until the kill) ran out.
    assert "lease expired" in lost[0].message and lost[0].data["incident"] == "lease_expired"
    lease_expired_at = datetime.fromisoformat(lost[0].data["lease_expired_at"])
    assert killed_at < lease_expired_at <= lost[0].created_at

    types = [e.type for e in job_events(c, victim)]
    expected = ["ADMITTED", "RUNNING", "CHECKPOINT", "LOST", "QUEUED", "ADMITTED", "RUNNING", "RESUMED", "SUCCEEDED"]
    it = iter(types)
    assert all(t in it for t in expected), f"timeline out of order: {types}"

    recovered = job_events(c, victim, "RECOVERED")
    assert len(recovered) == 1
    data = recovered[0].data
    assert data["lost_event_id"] == lost[0].id
    # Recovery time: from the LOST event to the second attempt's first step, as both were recorded.
    assert second.first_step_at is not None
    assert data["recovery_time_s"] == pytest.approx((second.first_step_at - lost[0].created_at).total_seconds())
    assert data["objective_s"] == 60.0 and data["met"] is (data["recovery_time_s"] <= 60.0)
    assert data["resumed_from_step"] == second.resumed_from_step

    with maker() as db:
        usage = db.scalars(select(Usage).where(Usage.job_id == victim).order_by(Usage.attempt_id)).all()
        host_down = db.scalars(select(Event).where(Event.type == "HOST_DOWN")).all()
    assert [u.gpu_type for u in usage] == ["cpu", "cpu"]
    assert all(u.ended_at is not None and u.gpu_seconds > 0 for u in usage)
    assert any(e.data.get("host") == host_a for e in host_down)

    # Each attempt's log holds the worker's notes AND the ranks' own stdout/stderr (what `kiln logs` streams).
    log_dir = get_settings().resolved_storage_dir / "logs" / str(victim)
    first_log, second_log = (log_dir / "1.log").read_text(), (log_dir / "2.log").read_text()
    assert "[kiln-worker" in first_log and "launching:" in first_log
    assert "[rank 0/1 local 0] pid " in first_log, "rank 0's stdout is missing from the log of attempt 1"
    assert "launching:" in second_log and "trainer exited with 0: succeeded" in second_log
    assert "[rank 0/1 local 0] pid " in second_log, "rank 0's stdout is missing from the log of attempt 2"
    assert "[rank 0/1 local 0] exit code 0" in second_log, "rank 0's stderr is missing from the log of attempt 2"


def test_a_restarted_worker_ends_its_predecessors_attempt_without_waiting_for_the_lease(tmp_path: Path) -> None:
    """kill -9 of a host's worker, then the worker starts again on the same host (its supervisor restarts it, as
    `kiln up` and systemd do): the new worker declares the old attempt LOST at its start -- long before the lease
    (two minutes here) would -- and the job resumes on the same host from its last verified checkpoint."""
    with cluster_on_new_database(tmp_path, "kiln_restart", lease_s=120.0) as c:
        host = c.start_worker("a", cpu_slots=1, hooks=slow_steps(0.15))
        wait_for(lambda: len(_hosts_up(c)) == 1, 60, "host registered")
        job_id = c.submit_job(tiny_spec("restarted", steps=60, every_steps=10))
        sched = c.scheduler_thread()
        try:
            wait_for(lambda: job_row(c, job_id).last_step >= 15, 90, "past step 15")
            c.kill_worker(host)
            c.start_worker("a", cpu_slots=1, hooks=slow_steps(0.15))
            wait_for(lambda: finished_state(c, job_id), 150, "finished after the restart")
        finally:
            sched.stop()
        job = job_row(c, job_id)
        attempts = job_attempts(c, job_id)
        lost = job_events(c, job_id, "LOST")
    assert job.state == "SUCCEEDED" and job.last_step == 60 and job.restart_count == 1, job.exit_reason
    assert [(a.state, a.placement[0]["host"]) for a in attempts] == [("LOST", host), ("SUCCEEDED", host)]
    assert len(lost) == 1 and "restarted" in lost[0].message, lost[0].message
    assert lost[0].data["incident"] == "worker_restarted"
    assert attempts[0].lease_expires_at is not None and lost[0].created_at < attempts[0].lease_expires_at
    assert attempts[1].resumed_from_step is not None and attempts[1].resumed_from_step >= 10


def _hosts_up(c: Cluster) -> list[str]:
    from core.models import Host

    with c.sessionmaker()() as db:
        return [h.name for h in db.scalars(select(Host).where(Host.state == "UP")).all()]
