"""Checkpoint export: a real checkpoint the trainer's Checkpointer wrote (replicated "raw" and sharded "dcp"),
requested over the API by the job's team, converted by the worker's export runner (``python -m trainer.export`` in
a child process), downloaded, and read back with the safetensors library: the very weights of the model."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as load_safetensors
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.deployment import deployment_uid
from core.fence import job_checkpoint_dir
from core.models import Checkpoint, Job
from core.settings import get_settings
from core.telemetry import Telemetry
from harness.read_only import read_only, require_mounts
from tests.support.api import World, build_world, make_app
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.store import list_checkpoints, sha256_file
from trainer.recipes.gpt import GPTRecipe
from workers.exports import ExportRunner
from workers.isolation import Isolation

pytestmark = pytest.mark.integration


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "storage"


@pytest.fixture
def export_client(db: Session, pg_engine: Engine, tmp_path: Path, storage: Path) -> Iterator[TestClient]:
    with TestClient(make_app(pg_engine, tmp_path, db, storage_dir=storage)) as c:
        yield c


@pytest.fixture
def export_world(db: Session, export_client: TestClient) -> World:
    return build_world(db, export_client)


def write_checkpoint(storage: Path, job_id: int, *, sharded: bool) -> dict[str, torch.Tensor]:
    """A tiny GPT, one optimizer step, a checkpoint at step 5; returns the model's weights."""
    torch.manual_seed(0)
    recipe = GPTRecipe(
        {"size": "tiny", "n_layer": 1, "batch_size": 2, "seq_len": 16, "corpus": "synthetic", "vocab_size": 64}
    )
    model = recipe.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randint(0, 64, (2, 16))
    model(x, x).backward()
    opt.step()
    root = job_checkpoint_dir(storage, job_id)
    tel = Telemetry(storage / "run", 0)
    ck = Checkpointer(
        root,
        rank=0,
        world_size=1,
        token=None,
        keep_last=2,
        asynchronous=False,
        sharded=sharded,
        group=None,
        device=torch.device("cpu"),
        telemetry=tel,
    )
    ck.save(5, model, opt, {"step": 5, "loss": 1.5}, blocking=True)
    ck.finish()
    tel.close()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@contextmanager
def in_test_transaction(db: Session) -> Iterator[Session]:
    yield db
    db.flush()


@pytest.mark.parametrize("sharded", [False, True], ids=["raw", "dcp"])
def test_the_team_exports_and_downloads_the_weights(
    export_client: TestClient, export_world: World, db: Session, storage: Path, tmp_path: Path, sharded: bool
) -> None:
    job_id = export_world.jobs["alpha"]
    weights = write_checkpoint(storage, job_id, sharded=sharded)
    ((step, path),) = list_checkpoints(job_checkpoint_dir(storage, job_id))
    db.add(
        Checkpoint(
            job_id=job_id, step=step, path=str(path), bytes=1, sha256=sha256_file(path / "manifest.json"), verified=True
        )
    )
    db.flush()
    member = export_world.h("member")

    r = export_client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=member)
    assert r.status_code == 202 and r.json()["state"] == "requested" and r.json()["step"] == 5, r.text
    early = export_client.get(f"/v1/jobs/{job_id}/exports/5/model.safetensors", headers=member)
    assert early.status_code == 409 and "requested" in early.json()["detail"]

    runner = ExportRunner(worker="test", storage_dir=storage, sessions=lambda: in_test_transaction(db))
    assert runner.run_once() and not runner.run_once()

    ready = export_client.get(f"/v1/jobs/{job_id}/exports/5", headers=member).json()
    assert ready["state"] == "ready", ready
    assert ready["files"] == [
        f"/v1/jobs/{job_id}/exports/5/model.safetensors",
        f"/v1/jobs/{job_id}/exports/5/manifest.json",
    ]
    blob = export_client.get(ready["files"][0], headers=export_world.h("viewer"))  # any member of the team
    assert blob.status_code == 200
    exported = load_safetensors(blob.content)
    assert set(exported) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(exported[name], tensor), name
    manifest = export_client.get(ready["files"][1], headers=member).json()
    (tmp_path / "w.safetensors").write_bytes(blob.content)
    assert manifest["sha256"] == ready["sha256"] == sha256_file(tmp_path / "w.safetensors")
    assert manifest["step"] == 5 and manifest["source"]["format"] == ("dcp" if sharded else "raw")
    assert manifest["parameters"] == sum(t.numel() for t in weights.values())
    again = export_client.post(f"/v1/jobs/{job_id}/exports", json={"step": 5}, headers=member)
    assert again.status_code == 200 and again.json()["state"] == "ready"


def test_only_the_jobs_team_may_export(export_client: TestClient, export_world: World, db: Session) -> None:
    job_id = export_world.jobs["alpha"]
    for role in ("beta-member", "admin"):  # another team's member; an admin who is not in the team
        r = export_client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=export_world.h(role))
        assert r.status_code == 404, (role, r.text)
    none_yet = export_client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=export_world.h("member"))
    assert none_yet.status_code == 404 and "no verified checkpoint" in none_yet.json()["detail"]


def test_a_checkpoint_that_does_not_verify_fails_the_export(
    export_client: TestClient, export_world: World, db: Session, storage: Path
) -> None:
    job_id = export_world.jobs["alpha"]
    write_checkpoint(storage, job_id, sharded=False)
    ((step, path),) = list_checkpoints(job_checkpoint_dir(storage, job_id))
    data = next(p for p in path.iterdir() if p.name.startswith("data_"))
    data.write_bytes(b"\0" + data.read_bytes()[1:])  # one flipped byte
    db.add(Checkpoint(job_id=job_id, step=step, path=str(path), bytes=1, sha256="x", verified=True))
    db.flush()
    export_client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=export_world.h("member"))
    ExportRunner(worker="test", storage_dir=storage, sessions=lambda: in_test_transaction(db)).run_once()
    failed = export_client.get(f"/v1/jobs/{job_id}/exports/{step}", headers=export_world.h("member")).json()
    assert failed["state"] == "failed" and "sha256 mismatch" in failed["error"], failed
    assert json.dumps(failed)  # a clear reason, no traceback


def test_a_sandboxed_export_converts_as_the_teams_uid_into_kilns_own_files(
    export_client: TestClient, export_world: World, db: Session, storage: Path
) -> None:
    """A worker that sandboxes (every default one) converts in the team's sandbox, as the team's uid, which may read
    only its own checkpoint; the files the API serves are then kiln's, moved out of the team's staging directory."""
    if os.geteuid() != 0:
        pytest.skip("a worker switches to the team's uid only as root (the CI runs as root)")
    job_id = export_world.jobs["alpha"]
    weights = write_checkpoint(storage, job_id, sharded=False)
    ((step, path),) = list_checkpoints(job_checkpoint_dir(storage, job_id))
    db.add(Checkpoint(job_id=job_id, step=step, path=str(path), bytes=1, sha256="x", verified=True))
    db.flush()
    isolation = Isolation(host="test", settings=get_settings(), host_slots=1, cgroup_bases=None)
    assert isolation.sandbox is not None, isolation.sandbox_error
    job = db.get(Job, job_id)
    assert job is not None
    user = isolation.users.for_team(job.team_id, deployment_uid(db))
    assert user is not None
    user.take(job_checkpoint_dir(storage, job_id), stop=storage)  # as the team's attempts leave it
    export_client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=export_world.h("member"))
    runner = ExportRunner(
        worker="test", storage_dir=storage, sessions=lambda: in_test_transaction(db), isolation=isolation
    )
    assert runner.run_once()
    ready = export_client.get(f"/v1/jobs/{job_id}/exports/{step}", headers=export_world.h("member")).json()
    assert ready["state"] == "ready", ready
    exported = load_safetensors(export_client.get(ready["files"][0], headers=export_world.h("member")).content)
    assert all(torch.equal(exported[name], tensor) for name, tensor in weights.items())
    out = storage / "exports" / str(job_id) / str(step)
    assert sorted(p.name for p in out.parent.iterdir()) == [str(step)]  # the staging directory is gone
    for name in ("model.safetensors", "manifest.json"):
        st = (out / name).lstat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600), name  # kiln's, not the team's


def test_an_export_that_cannot_be_written_fails_with_the_storages_error(
    export_client: TestClient, export_world: World, db: Session, storage: Path, tmp_path: Path
) -> None:
    """The exports' storage read-only (a real read-only bind mount): the export ends ``failed`` naming the error, at
    once, never ``ready``; it was left claimed, its worker's loop raising, until its claim went stale (15 min) and
    the next worker met the same error."""
    require_mounts(tmp_path)
    job_id = export_world.jobs["alpha"]
    write_checkpoint(storage, job_id, sharded=False)
    ((step, path),) = list_checkpoints(job_checkpoint_dir(storage, job_id))
    db.add(Checkpoint(job_id=job_id, step=step, path=str(path), bytes=1, sha256="x", verified=True))
    db.flush()
    isolation = Isolation(host="test", settings=get_settings(), host_slots=1, cgroup_bases=None)
    if isolation.sandbox is None:
        pytest.skip(f"no sandbox here: {isolation.sandbox_error}")
    export_client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=export_world.h("member"))
    runner = ExportRunner(
        worker="test", storage_dir=storage, sessions=lambda: in_test_transaction(db), isolation=isolation
    )
    (storage / "exports").mkdir()
    with read_only(storage / "exports"):
        assert runner.run_once()
    failed = export_client.get(f"/v1/jobs/{job_id}/exports/{step}", headers=export_world.h("member")).json()
    assert failed["state"] == "failed", failed
    assert failed["error"].startswith("the export could not be written") and "Read-only file system" in failed["error"]
