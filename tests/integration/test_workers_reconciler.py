"""The reconciler and the worker's claim against a real PostgreSQL (each test in a rolled-back transaction)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from core.db import utcnow
from core.fence import job_checkpoint_dir, read_fence, write_fence
from core.lifecycle import renew_lease, restart_backoff_s
from core.models import GPU, Attempt, Event, Host, Job, QosClass, Usage
from core.settings import Settings
from core.transitions import record_event
from harness.workers_cluster import admit, submit, tiny_spec
from scheduler.live import reconciler
from scheduler.live.loader import load_snapshot
from scheduler.live.reconciler import reconcile
from tests.support.nvml_replay import NVMLReplay
from workers import worker_state
from workers.attempt_env import attempt_env
from workers.claim import Refused, claim
from workers.claimed import Claimed
from workers.dispatch import dispatch_attempt
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration

SETTINGS = Settings(lease_s=10.0, heartbeat_interval_s=1.0)


def _host(db: Session, name: str, slots: int = 2) -> Host:
    agent = HostAgent(name=name, inventory=NoGpus(), cpu_slots=slots, address="127.0.0.1", settings=SETTINGS)
    host = agent.register(db)
    db.flush()
    return host


def _events(db: Session, job: Job, type_: str) -> list[Event]:
    return list(db.scalars(select(Event).where(Event.job_id == job.id, Event.type == type_).order_by(Event.id)))


def _running(db: Session, host: Host, *, max_restarts: int = 3) -> tuple[Job, Attempt]:
    job = submit(db, tiny_spec(f"j{host.name}"), max_restarts=max_restarts)
    attempt = admit(db, job, host)
    claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=SETTINGS,
    )
    return job, attempt


def test_expired_lease_requeues_with_backoff_and_frees_the_attempt(db: Session) -> None:
    host = _host(db, "rec-a")
    job, attempt = _running(db, host)
    assert job.state == "RUNNING" and attempt.state == "RUNNING"
    now = utcnow()
    assert reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt) == []  # the lease is fresh
    host.last_heartbeat_at = now  # the host is alive, only the attempt went silent
    later = now + timedelta(seconds=SETTINGS.lease_s + 1)
    host.last_heartbeat_at = later
    actions = reconcile(db=db, now=later, settings=SETTINGS, dispatch=dispatch_attempt)
    assert any("LOST -> QUEUED" in a for a in actions), actions
    assert job.state == "QUEUED" and job.restart_count == 1
    assert job.not_before == later + timedelta(seconds=restart_backoff_s(1, SETTINGS))
    assert attempt.state == "LOST" and attempt.ended_at == later
    lost = _events(db, job, "LOST")
    assert len(lost) == 1 and "lease expired" in lost[0].message
    queued = _events(db, job, "QUEUED")[-1]
    assert queued.data["avoid_hosts"] == ["rec-a"] and queued.data["backoff_s"] == 1.0
    # The scheduler's snapshot carries that preference: the restart goes to another host where one fits.
    pending = {p.id: p for p in load_snapshot(db=db, now=later).pending}
    assert pending[job.id].avoid_hosts == frozenset({"rec-a"})
    usage = db.scalars(select(Usage).where(Usage.attempt_id == attempt.id)).one()
    assert usage.ended_at is not None and usage.gpu_type == "cpu"


def test_a_lost_attempt_loses_its_fence_once_the_loss_is_committed(db: Session, tmp_path: Path) -> None:
    """A trainer the reconciler cannot see (its worker frozen) must not commit once its attempt is LOST: the fence
    on the shared storage is revoked after, and only after, the transaction that declared it lost commits."""
    settings = Settings(lease_s=10.0, heartbeat_interval_s=1.0, storage_dir=tmp_path)
    host = _host(db, "rec-f")
    (job, attempt), (kept, kept_attempt) = _running(db, host), _running(db, host)
    fence, kept_fence = job_checkpoint_dir(tmp_path, job.id), job_checkpoint_dir(tmp_path, kept.id)
    write_fence(fence, attempt.fencing_token)
    write_fence(kept_fence, kept_attempt.fencing_token)
    later = utcnow() + timedelta(seconds=SETTINGS.lease_s + 1)
    host.last_heartbeat_at = later
    kept_attempt.lease_expires_at = later + timedelta(seconds=5)  # this one's worker renewed in time
    reconcile(db=db, now=later, settings=settings, dispatch=dispatch_attempt)
    assert attempt.state == "LOST" and kept_attempt.state == "RUNNING"
    assert read_fence(fence) == str(attempt.fencing_token), "revoked before the loss was committed"
    db.commit()
    assert read_fence(fence) == f"revoked:{attempt.fencing_token}"
    assert read_fence(kept_fence) == str(kept_attempt.fencing_token)

    # A pass whose decision is rolled back revokes nothing.
    later2 = later + timedelta(seconds=SETTINGS.lease_s)
    host.last_heartbeat_at = later2
    reconcile(db=db, now=later2, settings=settings, dispatch=dispatch_attempt)
    assert kept_attempt.state == "LOST"
    db.rollback()
    assert read_fence(kept_fence) == str(kept_attempt.fencing_token)


def test_past_max_restarts_fails_with_the_reason(db: Session) -> None:
    host = _host(db, "rec-b")
    job, attempt = _running(db, host, max_restarts=0)
    later = utcnow() + timedelta(seconds=60)
    host.last_heartbeat_at = later
    reconcile(db=db, now=later, settings=SETTINGS, dispatch=dispatch_attempt)
    assert job.state == "FAILED"
    assert job.exit_reason is not None and "max_restarts=0" in job.exit_reason


def test_a_new_worker_process_ends_the_attempts_its_predecessor_claimed(
    db: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_state, "WORKER_INCARNATION", "first")
    host = _host(db, "rec-o")
    job, attempt = _running(db, host)
    assert attempt.placement[0]["worker"] == "first"
    same = HostAgent(
        name="rec-o", inventory=NoGpus(), cpu_slots=2, address=None, settings=SETTINGS, incarnation="first"
    )
    assert same.end_orphans(db) == []  # a re-registration by the same process ends nothing
    restarted = HostAgent(
        name="rec-o", inventory=NoGpus(), cpu_slots=2, address=None, settings=SETTINGS, incarnation="second"
    )
    restarted.register(db)
    db.flush()
    assert attempt.state == "LOST" and job.state == "QUEUED" and job.restart_count == 1
    lost = _events(db, job, "LOST")
    assert len(lost) == 1 and lost[0].data["incident"] == "worker_restarted"


def test_backoff_is_exponential_and_capped() -> None:
    assert [restart_backoff_s(n, SETTINGS) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert restart_backoff_s(50, SETTINGS) == SETTINGS.restart_backoff_cap_s


def test_stale_host_goes_down_and_an_unclaimed_attempt_there_is_given_up(db: Session) -> None:
    host = _host(db, "rec-c")
    job = submit(db, tiny_spec("never-picked"))
    attempt = admit(db, job, host)
    later = utcnow() + timedelta(seconds=reconciler.pickup_timeout_s(SETTINGS) + 5)
    actions = reconcile(db=db, now=later, settings=SETTINGS, dispatch=dispatch_attempt)
    assert "host rec-c: DOWN" in actions
    assert attempt.state == "LOST" and job.state == "QUEUED"
    assert "hosts not available: rec-c" in _events(db, job, "LOST")[0].message


def test_unclaimed_attempt_on_a_live_host_is_dispatched_again_after_commit(db: Session) -> None:
    host = _host(db, "rec-d")
    job = submit(db, tiny_spec("resend"))
    attempt = admit(db, job, host)
    later = utcnow() + timedelta(seconds=reconciler.pickup_timeout_s(SETTINGS) + 1)
    host.last_heartbeat_at = later
    actions = reconcile(db=db, now=later, settings=SETTINGS, dispatch=dispatch_attempt)
    assert f"attempt {attempt.id}: re-dispatched" in actions
    assert attempt.state == "PENDING" and attempt.lease_expires_at is not None
    assert db.info[reconciler._DISPATCH_KEY] == [(attempt.id, attempt.fencing_token, attempt.placement)]
    ev = _events(db, job, "REDISPATCHED")
    assert len(ev) == 1 and ev[0].data["attempt_id"] == attempt.id
    db.info.pop(reconciler._DISPATCH_KEY)  # rolled back: nothing must reach the broker


def test_stale_token_and_second_claim_are_refused_with_events(db: Session) -> None:
    host = _host(db, "rec-e")
    job, attempt = _running(db, host)
    with pytest.raises(Refused, match="already started"):
        claim(
            db,
            attempt_id=attempt.id,
            token=attempt.fencing_token,
            node_rank=0,
            host=host.name,
            delivery="d2",
            settings=SETTINGS,
        )
    with pytest.raises(Refused, match="stale fencing token"):
        claim(
            db,
            attempt_id=attempt.id,
            token=attempt.fencing_token + 7,
            node_rank=0,
            host=host.name,
            delivery="d3",
            settings=SETTINGS,
        )
    with pytest.raises(Refused, match="placed on"):
        job2 = submit(db, tiny_spec("elsewhere"))
        a2 = admit(db, job2, host)
        claim(
            db,
            attempt_id=a2.id,
            token=a2.fencing_token,
            node_rank=0,
            host="not-this-host",
            delivery="d4",
            settings=SETTINGS,
        )
    refused = _events(db, job, "DELIVERY_REFUSED")
    assert [e.data["delivery"] for e in refused] == ["d2", "d3"]


def test_recovery_time_recorded_against_the_objective(db: Session) -> None:
    host = _host(db, "rec-f")
    job, attempt = _running(db, host)
    t0 = utcnow() + timedelta(seconds=30)
    host.last_heartbeat_at = t0
    reconcile(db=db, now=t0, settings=SETTINGS, dispatch=dispatch_attempt)
    lost = _events(db, job, "LOST")[0]
    job.not_before = None
    second = admit(db, job, host)
    claim(
        db,
        attempt_id=second.id,
        token=second.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d5",
        settings=SETTINGS,
    )
    second.first_step_at = lost.created_at + timedelta(seconds=7.5)
    second.resumed_from_step = 20
    reconcile(db=db, now=utcnow(), settings=SETTINGS, dispatch=dispatch_attempt)  # the second attempt's lease is fresh
    rec = _events(db, job, "RECOVERED")
    assert len(rec) == 1
    assert rec[0].data["recovery_time_s"] == pytest.approx(7.5)
    assert rec[0].data["objective_s"] == 60.0 and rec[0].data["met"] is True
    reconcile(db=db, now=utcnow(), settings=SETTINGS, dispatch=dispatch_attempt)
    assert len(_events(db, job, "RECOVERED")) == 1  # once per incident
    assert len(_events(db, job, "LOST")) == 1


def test_gpu_xid_error_excludes_the_host_until_its_time_is_served(db: Session, tmp_path: Path) -> None:
    gpu = {
        "uuid": "GPU-replay-0",
        "index": 0,
        "model": "NVIDIA H200",
        "memory_bytes": 141 * 2**30,
        "mig_mode": False,
        "pcie_gen": 5,
        "nvlink_peers": [],
    }
    clean = {
        "uuid": "GPU-replay-0",
        "ts": 1.0,
        "utilization_pct": 90.0,
        "memory_used_bytes": 2**30,
        "pcie_tx_bytes_per_s": 1e9,
        "pcie_rx_bytes_per_s": 1e9,
        "nvlink_tx_bytes_per_s": None,
        "nvlink_rx_bytes_per_s": None,
        "temperature_c": 50.0,
        "ecc_uncorrected": 0,
        "xid_errors": [],
    }
    recording = tmp_path / "nvml.json"
    recording.write_text(json.dumps({"gpus": [gpu], "samples": [[clean], [{**clean, "xid_errors": [79]}]]}))
    agent = HostAgent(name="rec-gpu", inventory=NVMLReplay(recording), cpu_slots=0, address=None, settings=SETTINGS)
    host = agent.register(db)
    db.flush()
    assert [(g.model, g.name) for g in host.gpus] == [("H200", "NVIDIA H200")] and host.cpu_slots == 0
    agent.sample(db)
    db.flush()
    now = utcnow()
    assert reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt) == []
    agent.sample(db)  # Xid 79: fallen off the bus
    db.flush()
    actions = reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt)
    assert actions == [f"host rec-gpu: EXCLUDED ({host.exclusion_reason})"]
    assert host.state == "EXCLUDED" and "Xid 79" in (host.exclusion_reason or "")
    served = now + timedelta(seconds=SETTINGS.gpu_exclusion_s + 1)
    host.last_heartbeat_at = served
    assert reconcile(db=db, now=served, settings=SETTINGS, dispatch=dispatch_attempt) == ["host rec-gpu: readmitted"]
    assert host.state == "UP" and all(g.healthy for g in host.gpus)


def test_attempt_env_enforces_the_qos_caps_on_gpus(db: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_TEST_HOOKS", '{"sleep_per_step_s": 0.1}')  # the test harness's, on this worker
    monkeypatch.setenv("KILN_BROKER_URL", "redis://:secret@broker:6379")
    # A worker's own compiler cache dir (a unit test's Trainer once left one in the test process): not the job's.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/root/.cache/inductor")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/root/.cache/triton")
    silver = db.scalars(select(QosClass).where(QosClass.name == "silver")).one()
    silver.gpu_memory_cap_bytes, silver.sm_percent = 4 * 10**9, 60  # an admin's caps (the seeded silver has none)
    gpus = [
        GPU(uuid=f"GPU-{i}", index=i, model="H200", memory_bytes=140 * 10**9, host_id=0, nvlink_peers=["x"])
        for i in range(2)
    ]
    claimed = Claimed(
        job_id=5,
        team_id=1,
        attempt_number=2,
        spec={},
        placement=[],
        gpus=gpus,
        qos=silver,
        host_links={"pcie_bytes_per_s": 64 * 10**9},
        rendezvous=None,
        ran_before_s=0.0,
        deployment="d",
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(128)))
    monkeypatch.setattr(worker_state, "HOST_GPUS", 8)
    env = attempt_env(
        claimed, attempt_id=9, token=4, checkpoint_dir=Path("/c"), compile_dir=Path("/k"), lease_file=Path("/r/lease")
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    assert env["KILN_FENCING_TOKEN"] == "4" and env["KILN_CHECKPOINT_DIR"] == "/c"
    assert float(env["KILN_GPU_MEMORY_FRACTION"]) == pytest.approx(4e9 / 140e9, rel=1e-4)  # silver: 4 GB
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3814M,1=3814M"
    assert env["NCCL_MAX_NCHANNELS"] == "8"  # 16 GB/s of a 64 GB/s link: a quarter of 32 channels
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["OMP_NUM_THREADS"] == "16"  # each rank: 128 cores / 8 GPUs
    assert env["KILN_LEASE_FILE"] == "/r/lease" and env["KILN_TEST_HOOKS"] == '{"sleep_per_step_s": 0.1}'
    assert "TORCHINDUCTOR_CACHE_DIR" not in env and "TRITON_CACHE_DIR" not in env  # the trainer's: in /k
    assert not any(
        k.startswith("KILN_")
        and k
        not in (
            "KILN_FENCING_TOKEN",
            "KILN_CHECKPOINT_DIR",
            "KILN_COMPILE_CACHE_DIR",
            "KILN_JOB_ID",
            "KILN_ATTEMPT_ID",
            "KILN_GPU_MEMORY_FRACTION",
            "KILN_LEASE_FILE",
            "KILN_TEST_HOOKS",
        )
        for k in env
    )


def test_backoff_escalates_only_while_attempts_do_not_train(db: Session) -> None:
    host = _host(db, "rec-g")
    job, attempt = _running(db, host, max_restarts=10)
    t = utcnow()
    backoffs = []
    for i in range(3):  # three attempts that die before their first step: a crash loop
        t += timedelta(seconds=60)
        host.last_heartbeat_at = t
        reconcile(db=db, now=t, settings=SETTINGS, dispatch=dispatch_attempt)
        backoffs.append(_events(db, job, "QUEUED")[-1].data["backoff_s"])
        job.not_before = None
        attempt = admit(db, job, host)
        claim(
            db,
            attempt_id=attempt.id,
            token=attempt.fencing_token,
            node_rank=0,
            host=host.name,
            delivery=f"g{i}",
            settings=SETTINGS,
        )
    attempt.first_step_at = t  # this one trains: losing its host is not the job's fault
    attempt.resumed_from_step = 0
    job.last_step = 5
    t += timedelta(seconds=60)
    host.last_heartbeat_at = t
    reconcile(db=db, now=t, settings=SETTINGS, dispatch=dispatch_attempt)
    backoffs.append(_events(db, job, "QUEUED")[-1].data["backoff_s"])
    assert backoffs == [1.0, 2.0, 4.0, 1.0]
    assert job.restart_count == 4


def _drop_a_connection(engine: Engine) -> None:
    """What a PostgreSQL restart does to the scheduler: a connection of its engine dies under a statement."""
    with engine.connect() as victim:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as killer:
            killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(DBAPIError):
            victim.execute(text("SELECT 1"))


def test_database_outage_gives_running_attempts_one_lease_of_grace(db: Session, pg_engine: Engine) -> None:
    reconciler.reset_outage_tracking()
    live_host, dead_host = _host(db, "rec-h"), _host(db, "rec-i")
    live_job, live = _running(db, live_host)
    dead_job, dead = _running(db, dead_host)
    now = utcnow()
    try:
        actions_now = reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt)
        assert actions_now == []  # from here on the engine's errors are watched

        # The database goes away for longer than a lease: no worker could renew, no host agent heartbeat.
        _drop_a_connection(pg_engine)
        back = now + timedelta(seconds=SETTINGS.lease_s + 5)
        actions = reconcile(db=db, now=back, settings=SETTINGS, dispatch=dispatch_attempt)
        assert actions == [f"database back: {SETTINGS.lease_s:.0f} s of grace for leases and hosts"]
        assert live.state == dead.state == "RUNNING" and live_job.state == dead_job.state == "RUNNING"
        assert live_host.state == dead_host.state == "UP"
        back_ev = db.scalars(select(Event).where(Event.type == "DATABASE_BACK")).all()
        assert len(back_ev) == 1 and back_ev[0].data["grace_s"] == SETTINGS.lease_s

        # Within the grace the live worker's heartbeat gets through (lease renewed); the dead one's never does.
        mid = back + timedelta(seconds=2)
        live.heartbeat_at, live.lease_expires_at = mid, mid + timedelta(seconds=SETTINGS.lease_s)
        live_host.last_heartbeat_at = mid
        assert reconcile(db=db, now=mid + timedelta(seconds=1), settings=SETTINGS, dispatch=dispatch_attempt) == []

        # One lease after the database came back: the silent attempt is LOST, its host DOWN; the live one runs on.
        end = back + timedelta(seconds=SETTINGS.lease_s + 1)
        live_host.last_heartbeat_at = end
        actions = reconcile(db=db, now=end, settings=SETTINGS, dispatch=dispatch_attempt)
        assert "host rec-i: DOWN" in actions and "host rec-h: DOWN" not in actions
        assert any(f"job {dead_job.id}: LOST -> QUEUED" in a for a in actions), actions
        assert dead.state == "LOST" and dead_job.state == "QUEUED"
        assert live.state == "RUNNING" and live_job.state == "RUNNING" and live_job.restart_count == 0
    finally:
        reconciler.reset_outage_tracking()


def test_a_scheduler_that_did_not_see_the_outage_honours_the_recorded_grace(db: Session) -> None:
    reconciler.reset_outage_tracking()  # a scheduler process that starts (or takes over) after the outage
    host = _host(db, "rec-k")
    job, attempt = _running(db, host)
    now = utcnow() + timedelta(seconds=SETTINGS.lease_s + 5)  # the attempt's lease has expired
    host.last_heartbeat_at = now
    grace_until = now + timedelta(seconds=30)
    record_event(
        db,
        "DATABASE_BACK",
        message="recorded by the scheduler that saw it",
        data={"grace_until": grace_until.isoformat(), "grace_s": 30.0},
    )
    try:
        actions = reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt)
        assert actions == [
            f"database back before this scheduler: grace for leases and hosts until "
            f"{grace_until.isoformat(timespec='seconds')}"
        ]
        assert attempt.state == "RUNNING" and job.state == "RUNNING"
        assert len(_events(db, job, "LOST")) == 0
        assert len(db.scalars(select(Event).where(Event.type == "DATABASE_BACK")).all()) == 1  # not recorded again
        after = grace_until + timedelta(seconds=1)
        host.last_heartbeat_at = after
        actions_now = reconcile(db=db, now=after, settings=SETTINGS, dispatch=dispatch_attempt)
        assert any("LOST -> QUEUED" in a for a in actions_now)
        assert attempt.state == "LOST"
    finally:
        reconciler.reset_outage_tracking()


def test_a_postgresql_server_younger_than_a_lease_gives_grace(db: Session) -> None:
    started = db.execute(text("SELECT pg_postmaster_start_time()")).scalar_one()
    host_a, host_b = _host(db, "rec-l"), _host(db, "rec-m")
    (job_a, attempt_a), (job_b, attempt_b) = _running(db, host_a), _running(db, host_b)
    now = utcnow() + timedelta(seconds=SETTINGS.lease_s + 5)  # both attempts' leases have expired
    host_a.last_heartbeat_at = host_b.last_heartbeat_at = now
    try:
        # A server up for longer than a lease proves nothing: an expired lease is LOST at once.
        reconciler.reset_outage_tracking()
        attempt_b.lease_expires_at = utcnow() + timedelta(hours=1)  # b is out of this pass
        actions_now = reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt)
        assert any(f"job {job_a.id}: LOST -> QUEUED" in a for a in actions_now)
        assert attempt_a.state == "LOST"
        # With a lease longer than the server's uptime, leases may have expired while it was down: grace.
        attempt_b.lease_expires_at = now - timedelta(seconds=5)
        long_lease = Settings(lease_s=(now - started).total_seconds() + 120, heartbeat_interval_s=1.0)
        reconciler.reset_outage_tracking()
        actions = reconcile(db=db, now=now, settings=long_lease, dispatch=dispatch_attempt)
        assert len(actions) == 1 and actions[0].startswith("database back before this scheduler"), actions
        assert attempt_b.state == "RUNNING" and job_b.state == "RUNNING"
        back = db.scalars(select(Event).where(Event.type == "DATABASE_BACK")).one()
        assert back.data["cause"].startswith("PostgreSQL started at")
    finally:
        reconciler.reset_outage_tracking()


def test_statement_errors_are_not_outages(db: Session) -> None:
    reconciler.reset_outage_tracking()
    host = _host(db, "rec-j")
    job, attempt = _running(db, host)
    now = utcnow()
    reconcile(db=db, now=now, settings=SETTINGS, dispatch=dispatch_attempt)
    with pytest.raises(DBAPIError), db.begin_nested():
        db.execute(text("SELECT 1 / 0"))  # the database answered: an error, not an outage
    later = now + timedelta(seconds=SETTINGS.lease_s + 1)
    host.last_heartbeat_at = later
    actions = reconcile(db=db, now=later, settings=SETTINGS, dispatch=dispatch_attempt)
    assert any("LOST -> QUEUED" in a for a in actions), actions
    assert attempt.state == "LOST"


def test_a_gang_is_lost_when_one_node_goes_silent_though_the_other_renews(db: Session) -> None:
    """Each node of a gang renews its own lease and the attempt's is the earliest: a frozen host's node ends the
    gang's lease while the other host's worker, healthy, keeps renewing its own (its rank waits in a collective for
    a peer that never answers)."""
    from scheduler.live.apply import apply_all
    from scheduler.policy.decisions import Admission, Decisions, PlacementEntry

    hosts = [_host(db, f"rec-gang-{i}", slots=1) for i in range(2)]
    job = submit(db, {**tiny_spec("gang"), "resources": {"gpus": 0, "cpu_slots": 2}})
    entries = tuple(
        PlacementEntry(host=h.name, queue=h.queue, gpus=(), slots=1, node_rank=i) for i, h in enumerate(hosts)
    )
    assert apply_all(db=db, decisions=Decisions(admissions=(Admission(job.id, entries),)), now=utcnow()).admitted
    attempt = job.attempts[-1]
    t0 = utcnow()
    for i, h in enumerate(hosts):
        claim(
            db,
            attempt_id=attempt.id,
            token=attempt.fencing_token,
            node_rank=i,
            host=h.name,
            delivery=f"d{i}",
            settings=SETTINGS,
        )
    # Node 0's worker goes on renewing (its heartbeat calls this) for 15 s; node 1's host went silent at its claim.
    for dt in range(1, 16):
        renew_lease(attempt, node_rank=0, now=t0 + timedelta(seconds=dt), lease_s=SETTINGS.lease_s)
    assert attempt.lease_expires_at is not None and attempt.lease_expires_at < t0 + timedelta(seconds=12)
    actions = reconcile(db=db, now=t0 + timedelta(seconds=15), settings=SETTINGS, dispatch=dispatch_attempt)
    assert attempt.state == "LOST" and job.state == "QUEUED", actions
    lost = _events(db, job, "LOST")[-1]
    assert f"no heartbeat from {hosts[1].name} for" in lost.message and hosts[0].name not in lost.message


@pytest.mark.parametrize(("guaranteed", "priority"), [(True, "0"), (False, "1")])
def test_attempt_env_of_a_gpu_share_caps_it_and_puts_best_effort_below_normal_priority(
    db: Session, monkeypatch: pytest.MonkeyPatch, guaranteed: bool, priority: str
) -> None:
    """A share's caps go to MPS; a best-effort share is a below-normal MPS client, so its guaranteed neighbour's
    kernels are scheduled first (the H200's gold job kept 0.72x of alone beside a 30% share at equal priority)."""
    gpu = GPU(uuid="GPU-0", index=0, model="H200", memory_bytes=140 * 2**30, host_id=0, nvlink_peers=[])
    share = {"memory_bytes": 24 * 2**30, "sm_percent": 30, "guaranteed": guaranteed}
    claimed = Claimed(
        job_id=5,
        team_id=1,
        attempt_number=1,
        spec={},
        placement=[{"share": share}],
        gpus=[gpu],
        qos=None,
        host_links={},
        rendezvous=None,
        ran_before_s=0.0,
        deployment="d",
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))  # the H200 host's 16 cores
    monkeypatch.setattr(worker_state, "HOST_GPUS", 1)
    env = attempt_env(
        claimed, attempt_id=9, token=4, checkpoint_dir=Path("/c"), compile_dir=Path("/k"), lease_file=Path("/r/lease")
    )
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24576M"
    assert float(env["KILN_GPU_MEMORY_FRACTION"]) == pytest.approx(24 / 140, rel=1e-4)
    assert env["CUDA_MPS_CLIENT_PRIORITY"] == priority
    # Its 24 GiB of 140 is its part of the host's 16 cores: 3 threads, not 16 per share all spinning at once.
    assert env["OMP_NUM_THREADS"] == "3"
