"""A job's success needs its final state on durable storage (issue 39, item 1), end to end: real PostgreSQL and
Redis, a real worker process, the real scheduler, the trainer on CPU in its sandbox.

The job's checkpoint directory is made read-only (a read-only bind mount, as a remount of the storage would) after
its checkpoint of step 30 and across its last step, 40. The final save is retried for the worker's
``KILN_FINAL_CHECKPOINT_RETRY_S`` (3 s here) and then the attempt ends as an infrastructure failure: LOST with the
storage's error, never SUCCEEDED. Once the storage is writable again the job restarts from the last verified
checkpoint (30) and succeeds at step 40 with the loss of an uninterrupted twin. On main the trainer exited 0 and the
job read SUCCEEDED at step 40 with no checkpoint of step 40 anywhere (the chaos run's defect: step 400 recorded,
step 360 held).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.fence import job_checkpoint_dir
from core.models import Checkpoint
from core.settings import get_settings
from harness.read_only import make_read_only, make_writable, require_mounts, shared_mount
from harness.workers_cluster import Cluster, cluster_on_new_database, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import checkpoint_manifests, finished_state, job_attempts, job_events, job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Cluster]:
    require_mounts(tmp_path)
    storage = tmp_path / "storage"
    storage.mkdir()
    with shared_mount(storage), cluster_on_new_database(tmp_path, "kiln_durable", lease_s=8.0) as c:
        yield c


def _spec(name: str) -> dict[str, Any]:
    spec = tiny_spec(name, steps=40, every_steps=10)
    spec["checkpointing"]["keep_last"] = 100
    spec["sla"] = {"qos": "silver", "max_restarts": 5}
    return spec


def test_storage_read_only_across_the_last_step_restarts_the_job_which_then_succeeds_with_the_twins_loss(
    hosts: Cluster,
) -> None:
    c = hosts
    c.start_worker("a", cpu_slots=2, hooks=slow_steps(0.15), KILN_FINAL_CHECKPOINT_RETRY_S="3")
    twin, job = c.submit_job(_spec("twin")), c.submit_job(_spec("faulted"))
    ckpt_dir = job_checkpoint_dir(get_settings().resolved_storage_dir, job)
    sched = c.scheduler_thread()
    read_only = False
    try:
        wait_for(lambda: 30 in checkpoint_manifests(job), 180, "the checkpoint of step 30 committed")
        make_read_only(ckpt_dir)
        read_only = True
        lost = wait_for(lambda: job_events(c, job, "LOST"), 120, "the attempt LOST with the storage's error")[0]
        make_writable(ckpt_dir)
        read_only = False
        wait_for(lambda: finished_state(c, twin) and finished_state(c, job), 180, "both jobs finished")
    finally:
        sched.stop()
        if read_only:
            make_writable(ckpt_dir)

    assert "checkpoint storage unwritable: the final checkpoint of step 40" in lost.message, lost.message
    assert "Read-only file system" in lost.message
    assert job_events(c, job, "CHECKPOINT_STORAGE_ERROR") and job_events(c, job, "CHECKPOINT_RETRY")
    attempts = job_attempts(c, job)
    assert attempts[0].state == "LOST" and attempts[-1].state == "SUCCEEDED"
    assert attempts[-1].resumed_from_step == 30, "restarted from the last verified checkpoint"
    done, ref = job_row(c, job), job_row(c, twin)
    assert (done.state, ref.state) == ("SUCCEEDED", "SUCCEEDED"), (done.exit_reason, ref.exit_reason)
    assert done.last_step == ref.last_step == 40
    assert done.last_loss == pytest.approx(ref.last_loss, rel=1e-6, abs=1e-6)
    manifests = checkpoint_manifests(job)
    assert max(manifests) == 40 and manifests[40]["loss"] == pytest.approx(done.last_loss, abs=1e-9)
    with c.sessionmaker()() as db:
        rows = {r.step for r in db.query(Checkpoint).filter(Checkpoint.job_id == job)}
    assert 40 in rows
