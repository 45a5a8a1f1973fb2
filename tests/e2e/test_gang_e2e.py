"""Issue 12, fault 4: a gang job across two hosts, end to end on CPU.

Two ``python -m workers`` processes act as two hosts with one CPU slot each; the job asks for two slots, so the
real scheduler places one node on each, node 0 hosts the c10d rendezvous and the two ranks train as one DDP job
over gloo. SIGKILL of one host's worker and everything under it mid-run restarts the whole gang from the last
verified checkpoint, and the job ends with the loss of an uninterrupted twin. So does a host that freezes: its
node's lease runs out while the other host's worker renews its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from core.models import Checkpoint
from core.settings import get_settings
from harness.workers_cluster import Cluster, cluster_on_new_database, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import finished_state, job_attempts, job_events, job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STEPS = 40
EVERY = 10


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_gang", lease_s=10.0) as c:
        yield c


def _gang_spec(name: str) -> dict[str, object]:
    spec = tiny_spec(name, steps=STEPS, every_steps=EVERY)
    return {**spec, "resources": {"gpus": 0, "cpu_slots": 2}}


def test_a_gang_trains_across_two_hosts_and_survives_the_loss_of_one(two_hosts: Cluster) -> None:
    c = two_hosts
    hooks = slow_steps(0.15)
    hosts = [c.start_worker("a", cpu_slots=1, hooks=hooks), c.start_worker("b", cpu_slots=1, hooks=hooks)]
    maker = c.sessionmaker()
    sched = c.scheduler_thread()
    try:
        # The twin first, uninterrupted, on the same two hosts.
        twin = c.submit_job(_gang_spec("gang-twin"))
        wait_for(lambda: finished_state(c, twin), 240, "the uninterrupted gang finished")
        victim = c.submit_job(_gang_spec("gang-victim"))
        wait_for(lambda: job_row(c, victim).last_step >= EVERY + 5, 180, "the gang past its first checkpoint")
        with maker() as db:
            verified = max(db.scalars(select(Checkpoint.step).where(Checkpoint.job_id == victim)).all())
        head = job_attempts(c, victim)[0].placement[0]["host"]  # node 0: it hosts the rendezvous's c10d store
        c.kill_worker(head)  # the worker and everything under it, at once
        c.start_worker(head.rsplit("-", 1)[0], cpu_slots=1, hooks=hooks)  # its supervisor starts it again
        wait_for(lambda: finished_state(c, victim), 240, "the gang finished after the restart")

        # A host that freezes (SIGSTOP of its worker and everything under it: no connection is reset) while the
        # other host's worker, healthy, renews its own node's lease and its rank waits in a collective.
        frozen_job = c.submit_job(_gang_spec("gang-frozen"))
        wait_for(lambda: job_row(c, frozen_job).last_step >= EVERY + 5, 180, "the second gang past a checkpoint")
        node1 = job_attempts(c, frozen_job)[0].placement[1]["host"]
        tree = c.freeze_worker(node1)
        try:
            wait_for(lambda: job_events(c, frozen_job, "LOST"), 60, "the gang LOST by its frozen node's lease")
        finally:
            c.thaw(tree)
        wait_for(lambda: finished_state(c, frozen_job), 300, "the frozen gang finished after the thaw")
    finally:
        sched.stop()

    ref, job = job_row(c, twin), job_row(c, victim)
    assert ref.state == "SUCCEEDED", ref.exit_reason
    first = job_attempts(c, twin)
    assert len(first) == 1 and sorted(n["host"] for n in first[0].placement) == sorted(hosts), first[0].placement
    assert job.state == "SUCCEEDED", job.exit_reason
    assert job.restart_count == 1
    attempts = job_attempts(c, victim)
    assert [a.state for a in attempts] == ["LOST", "SUCCEEDED"], [(a.state, a.exit_reason) for a in attempts]
    assert all(len(a.placement) == 2 for a in attempts)
    second = attempts[1]
    # The whole gang restarted from the last verified checkpoint, and trained to the twin's very loss.
    assert second.resumed_from_step is not None and second.resumed_from_step >= verified
    assert job.last_step == ref.last_step == STEPS
    assert job.last_loss == pytest.approx(ref.last_loss, rel=1e-6, abs=1e-6)
    assert len(job_events(c, victim, "LOST")) == 1
    # The rank on the surviving host failed in its next collective (nccl_error), or in torchrun's rendezvous when
    # the loss reached that first, or was stopped when the attempt was declared LOST (which one depends on the
    # machine's load): a failure of the gang, restarted, never a crash blamed on the user's recipe.
    survivor = next(i for i, n in enumerate(attempts[0].placement) if n["host"] != head)
    first_log = (get_settings().resolved_storage_dir / "logs" / str(victim) / f"1.node{survivor}.log").read_text()
    assert "trainer exited with" in first_log and ": user_error:" not in first_log, first_log[-3000:]
    # Both nodes of each attempt ran a rank of a world of two.
    logs = get_settings().resolved_storage_dir / "logs" / str(victim)
    for name in ("2.log", "2.node1.log"):
        text = (logs / name).read_text()
        assert "/2 local 0] exit code 0" in text, text[-3000:]

    frozen = job_row(c, frozen_job)
    assert frozen.state == "SUCCEEDED" and frozen.restart_count == 1, frozen.exit_reason
    assert frozen.last_step == STEPS and frozen.last_loss == pytest.approx(ref.last_loss, rel=1e-6, abs=1e-6)
    lost = job_events(c, frozen_job, "LOST")
    assert len(lost) == 1 and f"lease expired: no heartbeat from {node1} for" in lost[0].message, lost[0].message
