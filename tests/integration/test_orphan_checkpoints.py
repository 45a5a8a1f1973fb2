"""Disk and database agree (issue 39, item 4): a checkpoint committed to disk whose row never came - its trainer
committed it during a database outage, and its attempt was declared lost before the worker could relay it - is
adopted (listed, exported) when it was committed under a valid fence, deleted with an event when its writer had
already lost the job, and reported once when it does not verify. Real PostgreSQL, real checkpoint directories
written by the trainer's commit protocol (``trainer.checkpoint.store``, no torch)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.fence import job_checkpoint_dir, read_fence, write_fence
from core.lifecycle import requeue_after_failure
from core.models import Attempt, Checkpoint, Event, Host, Job
from core.settings import Settings
from harness.workers_cluster import admit
from scheduler.live import orphan_checkpoints
from scheduler.live.orphan_checkpoints import reconcile_checkpoints
from scheduler.live.reconciler import reconcile
from tests.support.api import World, build_world, make_app
from trainer.checkpoint.store import MANIFEST, list_checkpoints, sha256_file, step_dir_name, write_manifest_and_commit
from workers.claim import claim
from workers.dispatch import dispatch_attempt
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "storage"


@pytest.fixture
def settings(storage: Path) -> Settings:
    return Settings(lease_s=10.0, heartbeat_interval_s=1.0, storage_dir=storage)


@pytest.fixture(autouse=True)
def fresh_scans() -> Iterator[None]:
    orphan_checkpoints.reset_scans()  # each test's database transaction is new: so are the passes' memories
    yield
    orphan_checkpoints.reset_scans()


@pytest.fixture
def api(db: Session, pg_engine: Engine, tmp_path: Path, storage: Path) -> Iterator[TestClient]:
    with TestClient(make_app(pg_engine, tmp_path, db, storage_dir=storage)) as c:
        yield c


@pytest.fixture
def world(db: Session, api: TestClient) -> World:
    return build_world(db, api)


def _running(db: Session, world: World, settings: Settings, storage: Path) -> tuple[Job, Attempt, Host]:
    """Team alpha's job, claimed by a worker on a host of its own; the claim wrote the fence."""
    agent = HostAgent(name="orphan-h", inventory=NoGpus(), cpu_slots=2, address="127.0.0.1", settings=settings)
    host = agent.register(db)
    db.flush()
    job = db.get(Job, world.jobs["alpha"])
    assert job is not None
    attempt = admit(db, job, host)
    claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=settings,
    )
    write_fence(job_checkpoint_dir(storage, job.id), attempt.fencing_token)
    return job, attempt, host


def _commit(root: Path, step: int, token: int, *, fence_root: Path | None = None, **meta: Any) -> Path:
    """A checkpoint committed by the trainer's own protocol: refused unless the fence (of ``fence_root``, default
    the job's directory) names ``token``."""
    tmp = root / f".tmp-{step_dir_name(step)}-test"
    tmp.mkdir(parents=True)
    (tmp / "state.bin").write_bytes(bytes(range(256)) * (step + 1))
    final = root / step_dir_name(step)
    write_manifest_and_commit(
        tmp,
        final,
        step=step,
        token=token,
        meta={"format": "raw", "tier": "durable", **meta},
        fence_root=fence_root or root,
    )
    return final


def _lose(db: Session, job: Job, attempt: Attempt, settings: Settings) -> None:
    """The attempt's lease ran out (its worker could not heartbeat through the outage): declared LOST as the
    reconciler declares it, and the commit revokes its fence."""
    requeue_after_failure(db, job=job, attempt=attempt, reason="lease expired", now=utcnow(), settings=settings)
    db.commit()


def _events(db: Session, job: Job, type_: str) -> list[Event]:
    return list(db.scalars(select(Event).where(Event.job_id == job.id, Event.type == type_).order_by(Event.id)))


def _rows(db: Session, job: Job) -> dict[int, Checkpoint]:
    return {c.step: c for c in db.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id))}


def test_a_checkpoint_committed_during_an_outage_is_adopted_listed_and_exported(
    db: Session, api: TestClient, world: World, settings: Settings, storage: Path
) -> None:
    job, attempt, host = _running(db, world, settings, storage)
    root = job_checkpoint_dir(storage, job.id)
    # The worker relayed step 10; during the outage the trainer committed step 20 under its valid fence and lease,
    # and the worker, fenced once the attempt was declared lost, never relayed it.
    db.add(
        Checkpoint(
            job_id=job.id,
            attempt_id=attempt.id,
            step=10,
            path=str(_commit(root, 10, attempt.fencing_token)),
            bytes=1,
            sha256="x",
            verified=True,
        )
    )
    path = _commit(root, 20, attempt.fencing_token, loss=2.1828)
    _lose(db, job, attempt, settings)
    assert read_fence(root) == f"revoked:{attempt.fencing_token}"
    member = world.h("member")
    listed = api.get(f"/v1/jobs/{job.id}/checkpoints", headers=member).json()
    assert [c["step"] for c in listed["items"]] == [10], "the bug: the job's records do not know step 20"

    actions = reconcile_checkpoints(db, utcnow(), settings)
    db.commit()

    assert actions == [f"job {job.id}: adopted the checkpoint at step 20 (attempt {attempt.number})"]
    row = _rows(db, job)[20]
    manifest = json.loads((path / MANIFEST).read_text())
    assert row.attempt_id == attempt.id and row.verified and row.path == str(path)
    assert row.sha256 == sha256_file(path / MANIFEST) and row.bytes == manifest["files"]["state.bin"]["bytes"]
    (adopted,) = _events(db, job, "CHECKPOINT_ADOPTED")
    assert (
        adopted.data["step"] == 20 and adopted.data["loss"] == 2.1828 and adopted.data["token"] == attempt.fencing_token
    )
    # What `kiln describe` lists and what `kiln checkpoint export` asks for (the latest verified) are step 20.
    listed = api.get(f"/v1/jobs/{job.id}/checkpoints", headers=member).json()
    assert [c["step"] for c in listed["items"]] == [10, 20]
    export = api.post(f"/v1/jobs/{job.id}/exports", json={}, headers=member)
    assert export.status_code == 202 and export.json()["step"] == 20, export.text
    assert path.is_dir()
    assert reconcile_checkpoints(db, utcnow(), settings) == []  # settled once: the next pass has nothing to do


def test_a_zombie_commit_after_the_loss_is_deleted_with_an_event(
    db: Session, world: World, api: TestClient, settings: Settings, storage: Path
) -> None:
    job, attempt, host = _running(db, world, settings, storage)
    root = job_checkpoint_dir(storage, job.id)
    _lose(db, job, attempt, settings)
    with pytest.raises(Exception, match="fence no longer names"):
        _commit(root, 30, attempt.fencing_token)  # the revoked fence refuses a commit that checks it now
    # A zombie whose fence check passed before the revocation and whose rename came after (a frozen process):
    # modelled by a check against a fence that still names it. Its manifest is written after the loss.
    stale = root.parent / "stale-fence"
    write_fence(stale, attempt.fencing_token)
    path = _commit(root, 30, attempt.fencing_token, fence_root=stale)

    actions = reconcile_checkpoints(db, utcnow(), settings)
    assert len(actions) == 1 and "discarded the checkpoint at step 30" in actions[0], actions
    assert path.is_dir(), "deleted before the decision was committed"
    db.commit()
    assert not path.exists() and list_checkpoints(root) == []
    (event,) = _events(db, job, "CHECKPOINT_DISCARDED")
    assert event.data["step"] == 30 and "after attempt 1 had lost the job" in event.data["reason"]
    assert 30 not in _rows(db, job)


def test_a_commit_older_than_the_next_attempts_resume_is_deleted(
    db: Session, world: World, api: TestClient, settings: Settings, storage: Path
) -> None:
    """The manifest's clock says nothing (dated before the loss), but the next attempt resumed from an earlier step:
    had this checkpoint been on disk, it would have resumed from it."""
    job, attempt, host = _running(db, world, settings, storage)
    root = job_checkpoint_dir(storage, job.id)
    kept = _commit(root, 10, attempt.fencing_token)
    _lose(db, job, attempt, settings)
    assert reconcile_checkpoints(db, utcnow(), settings) == [
        f"job {job.id}: adopted the checkpoint at step 10 (attempt {attempt.number})"
    ]
    db.commit()
    job.state, job.not_before = "QUEUED", None
    second = admit(db, job, host)
    claim(
        db,
        attempt_id=second.id,
        token=second.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d2",
        settings=settings,
    )
    second.resumed_from_step = 10
    stale = root.parent / "stale-fence"
    write_fence(stale, attempt.fencing_token)
    early = (attempt.ended_at - timedelta(seconds=5)).timestamp()  # type: ignore[operator]
    zombie = _commit(root, 20, attempt.fencing_token, fence_root=stale, created=early)
    second.ended_at = utcnow()  # the next end of one of the job's attempts brings its directory up again
    second.state = "SUCCEEDED"

    actions = reconcile_checkpoints(db, utcnow(), settings)
    db.commit()
    assert len(actions) == 1 and "resumed from step 10" in actions[0], actions
    assert not zombie.exists() and kept.is_dir()


def test_a_corrupt_checkpoint_is_reported_once_and_never_adopted(
    db: Session, world: World, api: TestClient, settings: Settings, storage: Path
) -> None:
    job, attempt, host = _running(db, world, settings, storage)
    root = job_checkpoint_dir(storage, job.id)
    path = _commit(root, 40, attempt.fencing_token)
    data = bytearray((path / "state.bin").read_bytes())
    data[7] ^= 0xFF  # a bit flipped on the storage after the commit
    (path / "state.bin").write_bytes(bytes(data))
    _lose(db, job, attempt, settings)

    actions = reconcile_checkpoints(db, utcnow(), settings)
    db.commit()
    assert actions == [f"job {job.id}: checkpoint at step 40 is corrupt (sha256 mismatch in state.bin)"]
    (event,) = _events(db, job, "CHECKPOINT_CORRUPT")
    assert event.data["path"] == str(path) and event.data["step"] == 40
    assert _rows(db, job) == {} and path.is_dir()  # as loading does: skipped, left for inspection
    orphan_checkpoints.reset_scans()  # a new scheduler looks back over the same end
    assert reconcile_checkpoints(db, utcnow(), settings) == []
    assert len(_events(db, job, "CHECKPOINT_CORRUPT")) == 1


def test_a_running_attempts_checkpoints_are_its_relays_and_only_ended_attempts_are_looked_at(
    db: Session, world: World, api: TestClient, settings: Settings, storage: Path
) -> None:
    job, attempt, host = _running(db, world, settings, storage)
    root = job_checkpoint_dir(storage, job.id)
    _commit(root, 10, attempt.fencing_token)
    assert reconcile_checkpoints(db, utcnow(), settings) == []  # no attempt ended: no directory is listed
    attempt.ended_at = utcnow()  # its end, as its worker's report records it
    assert reconcile_checkpoints(db, utcnow(), settings) == [
        f"job {job.id}: adopted the checkpoint at step 10 (attempt {attempt.number})"
    ]
    db.commit()
    # A checkpoint that appears afterwards waits for the job's next attempt end: no pass lists the directory again.
    _commit(root, 20, attempt.fencing_token)
    assert reconcile_checkpoints(db, utcnow(), settings) == []
    assert 20 not in _rows(db, job)


def test_a_token_no_attempt_held_is_deleted(
    db: Session, world: World, api: TestClient, settings: Settings, storage: Path
) -> None:
    job, attempt, host = _running(db, world, settings, storage)
    root = job_checkpoint_dir(storage, job.id)
    stale = root.parent / "other-fence"
    write_fence(stale, 999_999)
    path = _commit(root, 10, 999_999, fence_root=stale)
    _lose(db, job, attempt, settings)
    actions = reconcile_checkpoints(db, utcnow(), settings)
    db.commit()
    assert len(actions) == 1 and "which no attempt of the job held" in actions[0], actions
    assert not path.exists()


def test_the_reconcilers_pass_settles_the_checkpoints_of_the_attempt_it_declares_lost(
    db: Session, world: World, api: TestClient, settings: Settings, storage: Path
) -> None:
    job, attempt, host = _running(db, world, settings, storage)
    _commit(job_checkpoint_dir(storage, job.id), 20, attempt.fencing_token)
    now = utcnow()
    attempt.lease_expires_at = now - timedelta(seconds=1)
    host.last_heartbeat_at = now
    actions = reconcile(db=db, now=now, settings=settings, dispatch=dispatch_attempt)
    assert f"job {job.id}: adopted the checkpoint at step 20 (attempt {attempt.number})" in actions, actions
