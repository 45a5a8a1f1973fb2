"""A job's host memory and processes are bounded by the kernel, and a checkpoint's trainer state is read as data.

Before: a CPU job's size was bounded only by its spec (one job could exhaust the host's memory), and
``extra.pt`` was unpickled with ``weights_only=False`` (a crafted checkpoint ran code in the next attempt)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from core.models import Job
from core.settings import Settings
from core.telemetry import Telemetry
from harness.workers_cluster import Cluster, cluster_on_new_database, tiny_spec, wait_for
from trainer.checkpoint import Checkpointer
from trainer.checkpoint.store import EXTRA, MANIFEST, sha256_file
from workers.isolation import Isolation, Limits

MiB = 2**20


@pytest.fixture
def isolation(tmp_path: Path) -> Iterator[Isolation]:
    iso = Isolation.detect(host=f"sec-{tmp_path.name}", settings=Settings(home=tmp_path), host_slots=2)
    yield iso
    iso.close()


def _run_confined(iso: Isolation, name: str, limits: Limits, code: str) -> tuple[int, bool]:
    """A child process in its confinement, as the supervisor starts a trainer; (exit code, OOM-killed)."""
    confinement = iso.confine(name, limits)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], preexec_fn=confinement.enter, capture_output=True, timeout=60
        )
        return proc.returncode, confinement.oom_killed()
    finally:
        confinement.release()


def test_an_attempt_over_its_memory_is_stopped_alone(isolation: Isolation) -> None:
    grab = "x = bytearray(512 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('survived')"
    code, oom = _run_confined(isolation, "mem", Limits(memory_bytes=128 * MiB, pids=64, processes=1), grab)
    assert code != 0
    if isolation.mechanism == "cgroup":
        assert code == -9 and oom  # killed inside its own group, and counted as such
    roomy, oom = _run_confined(isolation, "roomy", Limits(memory_bytes=1024 * MiB, pids=64, processes=1), grab)
    assert (roomy, oom) == (0, False)


def test_an_attempt_cannot_start_unbounded_processes(isolation: Isolation) -> None:
    if isolation.mechanism != "cgroup":
        pytest.skip("without the pids controller the worker says so at start and sets no process limit")
    spawn = (
        "import threading, time\n"
        "ts = [threading.Thread(target=time.sleep, args=(2,)) for _ in range(200)]\n"
        "[t.start() for t in ts]\n"
    )
    code, _ = _run_confined(isolation, "pids", Limits(memory_bytes=512 * MiB, pids=32, processes=1), spawn)
    assert code != 0  # "can't start new thread" at the group's limit


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.marker),))  # type: ignore[return-value]


def test_a_crafted_checkpoint_runs_no_code(tmp_path: Path) -> None:
    tel = Telemetry(tmp_path / "run", rank=0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = Checkpointer(
        tmp_path / "ckpt",
        rank=0,
        world_size=1,
        token=None,
        keep_last=2,
        asynchronous=False,
        sharded=False,
        group=None,
        device=torch.device("cpu"),
        telemetry=tel,
    )
    ck.save(1, model, opt, {"step": 1}, blocking=True)
    path = ck.choose()
    assert path is not None
    # What a job can write in its own checkpoint directory: a pickle that runs code, with a manifest to match.
    marker = tmp_path / "pwned"
    torch.save([_Payload(marker)], path / EXTRA)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"][EXTRA] = {"bytes": (path / EXTRA).stat().st_size, "sha256": sha256_file(path / EXTRA)}
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(pickle.UnpicklingError):
        ck.load(path, model, opt)
    assert not marker.exists()
    tel.close()


@pytest.fixture
def one_host(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_sec_host", lease_s=10.0) as c:
        yield c


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_job_over_its_host_memory_fails_and_the_host_goes_on(one_host: Cluster) -> None:
    """The real worker and trainer: a job whose limit is below what torch needs is killed inside its own group
    and FAILS (not retried as a host failure); the next job on the same host trains to the end."""
    c = one_host
    c.activate()
    host = c.start_worker("a")
    maker = c.sessionmaker()
    small = tiny_spec("small", steps=20)
    small["resources"]["host_memory_bytes"] = 96 * MiB
    hungry, normal = c.submit_job(small), c.submit_job(tiny_spec("normal", steps=20))
    sched = c.scheduler_thread()
    try:

        def ended(job_id: int) -> Job | None:
            with maker() as db:
                job = db.scalars(select(Job).where(Job.id == job_id)).one()
                return job if job.state in ("SUCCEEDED", "FAILED", "CANCELLED") else None

        first = wait_for(lambda: ended(hungry), 180, "the small job to end")
        assert first.state == "FAILED" and first.restart_count == 0, (first.exit_reason, c.log_text(host))
        assert "out of host memory" in (first.exit_reason or "") and str(96 * MiB) in (first.exit_reason or "")
        second = wait_for(lambda: ended(normal), 180, "the normal job to end")
        assert second.state == "SUCCEEDED", (second.exit_reason, c.log_text(host))
        assert "host resources:" in c.log_text(host)
    finally:
        sched.stop()
