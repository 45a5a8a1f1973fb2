"""The failover walk that the user-code and script-mode failover tests share: a victim and its uninterrupted twin,
the victim's host SIGKILLed mid-run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.workers_cluster import Cluster, wait_for
from tests.support.cluster_rows import job_row


def sigkill_the_host_mid_run_beside_a_twin(
    c: Cluster, submit: Callable[[str], int], *, hooks: dict[str, Any] | None = None
) -> tuple[int, int]:
    """Host a runs the job ``submit("victim")`` returns; host b comes up and runs ``submit("reference")``, the
    uninterrupted twin (a is full); past step 25 host a's worker and everything under it are SIGKILLed; both jobs
    end. ``hooks``: the trainer's test hooks on both workers. Returns (victim, reference)."""
    host_a = c.start_worker("a", cpu_slots=1, hooks=hooks)
    victim = submit("victim")
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, victim).state == "RUNNING", 60, "victim running")
        c.start_worker("b", cpu_slots=2, hooks=hooks)
        reference = submit("reference")
        wait_for(lambda: job_row(c, victim).last_step >= 25, 120, "victim past step 25")
        c.kill_worker(host_a)
        wait_for(lambda: job_row(c, victim).state in ("SUCCEEDED", "FAILED"), 200, "victim finished after failover")
        wait_for(lambda: job_row(c, reference).state in ("SUCCEEDED", "FAILED"), 120, "reference finished")
    finally:
        sched.stop()
    return victim, reference
