"""The chaos bench's harness in CI, with fewer jobs and faults (``bench/chaos_bench.py`` runs them all).

A PostgreSQL and a Redis of the test's own (free ports: the shared servers never see these faults), the API, two
schedulers, two workers, the tiny GPT on CPU. One fault-free twin first, then six jobs through the API under: the
leading scheduler frozen past its lease while a job is submitted (a standby must admit it within the lease and
2 s), a worker frozen past its lease while its trainers train on, a trainer SIGKILLed, the leading scheduler
SIGKILLed, the API SIGKILLed, Redis SIGKILLed, PostgreSQL stopped with ``pg_ctl stop -m immediate``, PostgreSQL
stopped past the attempts' leases while the leader dies (a standby leads when it is back), a job's checkpoint
directory read-only across its last step. Then the acceptance's invariants, from the database and the checkpoints
on disk: every job SUCCEEDED with no manual restart; no checkpoint committed by an attempt after it was declared
LOST; each job's step, loss and checkpoint list are its last checkpoint's; each final loss is the twin's; no
attempt declared LOST for silence inside a database outage.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.chaos import chaos_cluster, chaos_spec, check_invariants, timeline_verdicts
from harness.private_servers import private_servers_available
from harness.workers_cluster import wait_for
from trainer.checkpoint.store import verify

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LEASE_S = 5.0
LEADER_LEASE_S = 3.0  # chaos_cluster's


def test_jobs_survive_the_faults_and_their_results_are_their_checkpoints(tmp_path: Path) -> None:
    missing = private_servers_available()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the chaos test needs a private PostgreSQL and Redis: {missing}")
        pytest.skip(missing)
    with chaos_cluster(tmp_path, lease_s=LEASE_S, worker_slots=2, step_sleep_s=0.15) as chaos:
        spec = lambda name: chaos_spec(name, seed=11, steps=60, every_steps=10)  # noqa: E731
        twin = chaos.submit(spec("twin"))
        chaos.wait_final([twin], 180)
        jobs: list[int] = []

        def submit() -> int:
            jobs.append(chaos.submit(spec(f"chaos-{len(jobs) + 1}")))
            return jobs[-1]

        chaos.sigstop_leader(for_s=3 * LEADER_LEASE_S, submit=submit)
        for _ in range(3):
            submit()
        a, b = chaos.c.host("a"), chaos.c.host("b")
        chaos.sigstop_worker(a, for_s=2.5 * LEASE_S)
        chaos.sigkill_trainer(b, a)
        chaos.sigkill_leader(down_s=1.0)
        chaos.sigkill_api(down_s=1.0)
        chaos.sigkill_redis(down_s=1.0)
        chaos.postgres_immediate_stop(down_s=LEASE_S / 2)
        submit()
        submit()
        wait_for(lambda: chaos.running_on(a) + chaos.running_on(b), 90, "a job training")
        chaos.postgres_outage_with_leader_change(down_s=2 * LEASE_S, lease_s=LEASE_S)
        chaos.read_only_across_last_step(for_s=2 * LEASE_S, steps=60, every_steps=10)
        chaos.wait_final(jobs, 240)
        verdicts = check_invariants(chaos, jobs, {j: twin for j in jobs}, verify=verify)
        verdicts += timeline_verdicts(chaos, LEADER_LEASE_S)
        timeline = [(f.at_s, f.fault, f.target, f.detail) for f in chaos.timeline]
    for v in verdicts:
        assert v.ok, (v.name, v.failures, timeline)
    # The faults hit what they were aimed at: the frozen worker's and the killed trainer's jobs were LOST.
    faults = {f[1]: f[3] for f in timeline}
    assert faults["SIGSTOP worker"]["lost"] and faults["SIGKILL trainer"]["lost"], timeline
    assert faults["SIGSTOP leader scheduler past its lease"]["new_leader"], timeline
