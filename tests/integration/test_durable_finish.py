"""A success is recorded only on the final checkpoint the durable storage holds (issue 39, item 1), through the
worker's real ending of an attempt (``AttemptRunner.finish``: classify, check, report) against a real PostgreSQL
and real checkpoint directories. Its report's unit of work is the test's transaction (rolled back after it).

The chaos run's defect: the trainer exited 0 after its final save failed, and the job read SUCCEEDED at step 400
while its newest checkpoint on disk and in the database was step 360's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.fence import job_checkpoint_dir
from core.models import Checkpoint, Event, Job
from core.settings import Settings
from harness.workers_cluster import admit, submit, tiny_spec
from trainer.checkpoint.store import sha256_file, step_dir_name, write_manifest_and_commit
from workers.claim import claim
from workers.host_agent import HostAgent
from workers.inventory import NoGpus
from workers.runner import AttemptRunner
from workers.supervisor import TrainerProcess

pytestmark = pytest.mark.integration


def commit_checkpoint(root: Path, step: int, loss: float, token: int) -> Path:
    """A checkpoint as the trainer commits it: files, manifest (with the loss), rename under the fence."""
    tmp = root / f".tmp-{step_dir_name(step)}"
    tmp.mkdir(parents=True)
    (tmp / "data_0.bin").write_bytes(bytes([step % 256]) * 4096)
    write_manifest_and_commit(tmp, root / step_dir_name(step), step=step, token=token, meta={"loss": loss})
    return root / step_dir_name(step)


def checkpoint_record(path: Path, step: int, loss: float) -> dict[str, Any]:
    return {
        "kind": "checkpoint",
        "rank": 0,
        "ts": time.time(),
        "step": step,
        "path": str(path),
        "bytes": 4096,
        "sha256": sha256_file(path / "manifest.json"),
        "verified": True,
        "loss": loss,
    }


@pytest.fixture
def ending(db: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Job, AttemptRunner]]:
    """A job of 60 steps claimed on a host, its runner's trainer already gone; reports go into the test's
    transaction."""
    settings = Settings(lease_s=10.0, heartbeat_interval_s=1.0, storage_dir=tmp_path / "storage")
    host = HostAgent(
        name="durable-a", inventory=NoGpus(), cpu_slots=1, address="127.0.0.1", settings=settings
    ).register(db)
    db.flush()
    job = submit(db, tiny_spec("durable", steps=60))
    attempt = admit(db, job, host)
    claimed = claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=settings,
    )
    proc = TrainerProcess([], env={}, log_path=tmp_path / "1.log", run_dir=tmp_path / "run", cwd=tmp_path)
    runner = AttemptRunner(
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        settings=settings,
        claimed=claimed,
        proc=proc,
    )

    @contextmanager
    def in_test_transaction() -> Iterator[Session]:
        yield db
        db.flush()

    monkeypatch.setattr("workers.runner.session_scope", in_test_transaction)
    yield job, runner


def test_a_success_whose_final_checkpoint_never_landed_is_an_infrastructure_failure(
    db: Session, ending: tuple[Job, AttemptRunner]
) -> None:
    job, runner = ending
    root = job_checkpoint_dir(runner.settings.resolved_storage_dir, job.id)
    c40 = commit_checkpoint(root, 40, 2.18, runner.token)
    # The trainer trained to 60, its final save failed (not committed), and it exited 0 all the same.
    runner.buffer = [
        checkpoint_record(c40, 40, 2.18),
        {"kind": "step", "rank": 0, "ts": time.time(), "step": 60, "loss": 2.06},
        {"kind": "done", "rank": 0, "ts": time.time(), "steps": 60, "final_loss": 2.06},
    ]
    outcome = runner.finish(0)

    assert outcome.exit_class == "infrastructure", outcome
    assert job.state == "QUEUED" and job.restart_count == 1, (job.state, job.exit_reason)
    lost = db.scalars(select(Event).where(Event.job_id == job.id, Event.type == "LOST")).one()
    assert "final checkpoint not durable: step 60 is not verified" in lost.message
    assert "the newest verified one is step 40's" in lost.message
    assert not db.scalars(select(Event).where(Event.job_id == job.id, Event.type == "SUCCEEDED")).all()
    assert [r.step for r in db.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id))] == [40]


def test_a_success_records_its_final_checkpoint_and_adopts_a_row_the_relay_missed(
    db: Session, ending: tuple[Job, AttemptRunner]
) -> None:
    job, runner = ending
    root = job_checkpoint_dir(runner.settings.resolved_storage_dir, job.id)
    c40 = commit_checkpoint(root, 40, 2.18, runner.token)
    final = commit_checkpoint(root, 60, 2.06, runner.token)
    # The final checkpoint is on disk, verified; its record never reached the worker (its relay was lost).
    runner.buffer = [
        checkpoint_record(c40, 40, 2.18),
        {"kind": "done", "rank": 0, "ts": time.time(), "steps": 60, "final_loss": 2.06},
    ]
    outcome = runner.finish(0)

    assert outcome.exit_class == "succeeded", outcome
    assert job.state == "SUCCEEDED" and (job.last_step, job.last_loss) == (60, 2.06)
    rows = {r.step: r for r in db.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id))}
    assert sorted(rows) == [40, 60]
    assert rows[60].sha256 == sha256_file(final / "manifest.json") and rows[60].verified
    assert rows[60].attempt_id == runner.attempt_id and rows[60].path == str(final)
