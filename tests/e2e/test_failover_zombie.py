"""An attempt declared lost commits nothing more, and a job's recorded result is what its checkpoints hold.

Real PostgreSQL, real Redis, real worker processes as hosts, the real scheduler and the trainer on CPU:

- a worker frozen (SIGSTOP) past its lease while its trainer trains on: the trainer stops at the end of the lease
  its worker no longer renews, the reconciler declares the attempt LOST and revokes its fence, and the trainer
  exits FENCED without committing another checkpoint; the job restarts elsewhere from the last checkpoint the
  lost attempt committed in time, and ends with the step and loss of its final checkpoint, equal to an
  uninterrupted twin's;
- a whole node frozen (worker and trainer) past its lease, then thawed worker first: the worker's heartbeat
  finds its token gone and stops the trainer (the worker's fenced stop), which commits nothing on its way out.

Plus user mistakes: a job whose settings cannot run fails at once with the user's own exception line, and is
not restarted as if a host had failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from core.fence import job_checkpoint_dir
from core.models import Checkpoint
from core.settings import get_settings
from core.trainer_protocol import ExitCode
from harness.workers_cluster import Cluster, cluster_on_new_database, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import checkpoint_manifests, job_attempts, job_events, job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(360)]

LEASE_S = 8.0
STEPS = 60


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_zombie", lease_s=LEASE_S) as c:
        yield c


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _telemetry(job_id: int, attempt: int = 1) -> list[dict[str, Any]]:
    """Rank 0's records of the job's attempt (a line being written is left for the next read)."""
    path = get_settings().resolved_storage_dir / "runs" / str(job_id) / str(attempt) / "telemetry" / "rank0.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def _exit_of(job_id: int) -> dict[str, Any] | None:
    return next((r["fields"] for r in _telemetry(job_id) if r["kind"] == "event" and r["type"] == "EXIT"), None)


def test_a_lost_attempt_never_commits_and_the_result_is_its_checkpoints(hosts: Cluster) -> None:
    c = hosts
    slow = slow_steps(0.15)
    names = [c.start_worker("a", hooks=slow), c.start_worker("c", hooks=slow)]
    spec = tiny_spec("victim", steps=STEPS, every_steps=5)
    spec["checkpointing"]["keep_last"] = 100  # every checkpoint stays on disk, to be checked below
    zombie, frozen = c.submit_job(spec), c.submit_job({**spec, "name": "frozen-node"})
    sched = c.scheduler_thread()
    stopped: list[int] = []
    try:
        wait_for(lambda: all(job_row(c, j).last_step >= 12 for j in (zombie, frozen)), 120, "both jobs training")
        host_of = {j: job_attempts(c, j)[0].placement[0]["host"] for j in (zombie, frozen)}
        assert sorted(host_of.values()) == sorted(names)
        c.start_worker("b", cpu_slots=3, hooks=slow)  # the twin now, and room for both restarts later
        twin = c.submit_job({**spec, "name": "twin"})
        wait_for(lambda: job_row(c, twin).state == "RUNNING", 60, "the uninterrupted twin running")

        # Freeze: on one host the worker alone (its trainer trains on), on the other the whole node.
        zombie_worker = c.workers[host_of[zombie]].pid
        frozen_worker = c.workers[host_of[frozen]].pid
        frozen_trainer = c.trainer_pids(host_of[frozen])
        assert frozen_trainer, "torchrun and its rank"
        stopped = [zombie_worker, frozen_worker, *frozen_trainer]
        _signal(stopped, signal.SIGSTOP)

        # Declared LOST once the lease is out; the zombie's trainer, which no worker supervises, stops on its own.
        lost = {j: wait_for(lambda j=j: job_events(c, j, "LOST"), 60, f"job {j} LOST")[0] for j in (zombie, frozen)}
        zombie_exit = wait_for(lambda: _exit_of(zombie), 30, "the zombie trainer's exit")
        assert zombie_exit["exit_code"] == ExitCode.FENCED, zombie_exit

        # Thaw the frozen node's worker first: its heartbeat finds the token gone and stops the trainer.
        _signal([frozen_worker], signal.SIGCONT)
        log = get_settings().resolved_storage_dir / "logs" / str(frozen) / "1.log"
        wait_for(lambda: "the fencing token moved on" in log.read_text(), 30, "the worker's fenced stop")
        _signal(frozen_trainer, signal.SIGCONT)
        frozen_exit = wait_for(lambda: _exit_of(frozen), 60, "the frozen trainer's exit")
        assert frozen_exit["exit_code"] in (ExitCode.FENCED, ExitCode.LEASE_EXPIRED), frozen_exit
        _signal([zombie_worker], signal.SIGCONT)
        stopped = []

        for j in (zombie, frozen, twin):
            wait_for(lambda j=j: job_row(c, j).state in ("SUCCEEDED", "FAILED"), 150, f"job {j} finished")
    finally:
        _signal(stopped, signal.SIGCONT)
        sched.stop()

    ref = job_row(c, twin)
    assert ref.state == "SUCCEEDED" and ref.last_step == STEPS, ref.exit_reason
    for job_id in (zombie, frozen):
        _check_lost_attempt_and_result(c, job_id, lost[job_id].created_at.timestamp(), ref.last_loss)

    # The zombie's trainer stopped training by itself when the lease its frozen worker no longer renewed ran out.
    assert any(r["kind"] == "event" and r["type"] == "LEASE_EXPIRED" for r in _telemetry(zombie))
    # The frozen node was stopped by its worker within the grace, not killed after it.
    log_text = (get_settings().resolved_storage_dir / "logs" / str(frozen) / "1.log").read_text()
    assert "grace period over" not in log_text and "trainer exited with" in log_text


def _check_lost_attempt_and_result(c: Cluster, job_id: int, lost_at: float, twin_loss: float | None) -> None:
    job = job_row(c, job_id)
    assert job.state == "SUCCEEDED", job.exit_reason
    first, second = job_attempts(c, job_id)
    assert (first.state, second.state) == ("LOST", "SUCCEEDED") and job.restart_count == 1

    # Nothing was committed under the lost attempt's token after it was declared lost, on disk or in telemetry.
    manifests = checkpoint_manifests(job_id)
    by_lost = {s: m for s, m in manifests.items() if m["fencing_token"] == first.fencing_token}
    assert by_lost, "the lost attempt committed checkpoints before it was lost"
    assert max(m["created"] for m in by_lost.values()) < lost_at, (lost_at, sorted(by_lost))
    assert all(r["ts"] < lost_at for r in _telemetry(job_id) if r["kind"] == "checkpoint")
    # The next attempt resumed from the lost one's last checkpoint, committed in time.
    assert second.resumed_from_step == max(by_lost)

    # The recorded result is the final checkpoint's, and the uninterrupted twin's.
    final = manifests[max(manifests)]
    assert (job.last_step, max(manifests), final["fencing_token"]) == (STEPS, STEPS, second.fencing_token)
    assert job.last_loss is not None and job.last_loss == pytest.approx(final["loss"], abs=1e-9)
    assert job.last_loss == pytest.approx(twin_loss, rel=1e-6, abs=1e-6)

    # The checkpoint list: rows only for checkpoints on disk, each matching its manifest; none by the lost
    # attempt after it was lost; and every checkpoint this job's state comes from is listed.
    with c.sessionmaker()() as db:
        rows = db.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).all()
    root = job_checkpoint_dir(get_settings().resolved_storage_dir, job_id)
    for row in rows:
        manifest_file = root / f"step_{row.step:08d}" / "manifest.json"
        assert row.step in manifests and row.sha256 == hashlib.sha256(manifest_file.read_bytes()).hexdigest()
        assert row.attempt_id != first.id or row.created_at.timestamp() < lost_at
    assert {s for s in manifests if s >= second.resumed_from_step} <= {r.step for r in rows}


def test_a_users_mistake_fails_at_once_with_its_reason(hosts: Cluster) -> None:
    c = hosts
    c.start_worker("a", cpu_slots=1)
    # Each setting valid on its own (the typed hyperparameters accept them at submit), together impossible: the
    # corpus is shorter than one sequence. The trainer used to crash on it, and the job restarted as if a host had
    # failed until the contract's restarts were spent.
    job_id = c.submit_job(tiny_spec("short-data", steps=20, corpus_bytes=4096, seq_len=8192))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, job_id).state in ("SUCCEEDED", "FAILED"), 120, "the job ended")
    finally:
        sched.stop()
    job = job_row(c, job_id)
    assert job.state == "FAILED" and job.restart_count == 0, (job.state, job.exit_reason)
    assert job.exit_reason == "user error: building the data: ValueError: corpus shorter than one sequence"
    assert not job_events(c, job_id, "LOST")
    (attempt,) = job_attempts(c, job_id)
    assert attempt.state == "FAILED" and attempt.exit_code == ExitCode.USER_ERROR
