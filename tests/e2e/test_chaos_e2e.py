"""The chaos bench's harness in CI, with fewer jobs and faults (``bench/chaos_bench.py`` runs them all).

A PostgreSQL and a Redis of the test's own (free ports: the shared servers never see these faults), the API, two
schedulers, two workers, the tiny GPT on CPU. One fault-free twin first, then four jobs through the API under: a
worker frozen past its lease while its trainers train on, a trainer SIGKILLed, the leading scheduler SIGKILLed, the
API SIGKILLed, Redis SIGKILLed, PostgreSQL stopped with ``pg_ctl stop -m immediate``. Then the acceptance's
invariants, from the database and the checkpoints on disk: every job SUCCEEDED with no manual restart; no
checkpoint committed by an attempt after it was declared LOST; each job's step, loss and checkpoint list are its
last checkpoint's; each final loss is the twin's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.chaos import chaos_cluster, chaos_spec, check_invariants
from tests.support.private_servers import private_servers_available
from trainer.checkpoint.store import verify

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LEASE_S = 5.0


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
        jobs = [chaos.submit(spec(f"chaos-{i}")) for i in range(1, 5)]
        a, b = chaos.c.host("a"), chaos.c.host("b")
        chaos.sigstop_worker(a, for_s=2.5 * LEASE_S)
        chaos.sigkill_trainer(b, a)
        chaos.sigkill_leader(down_s=1.0)
        chaos.sigkill_api(down_s=1.0)
        chaos.sigkill_redis(down_s=1.0)
        chaos.postgres_immediate_stop(down_s=LEASE_S / 2)
        chaos.wait_final(jobs, 240)
        verdicts = check_invariants(chaos, jobs, {j: twin for j in jobs}, verify=verify)
        timeline = [(f.at_s, f.fault, f.target, f.detail) for f in chaos.timeline]
    for v in verdicts:
        assert v.ok, (v.name, v.failures, timeline)
    # The faults hit what they were aimed at: the frozen worker's and the killed trainer's jobs were LOST.
    lost = {f[1]: f[3].get("lost") for f in timeline}
    assert lost["SIGSTOP worker"] and lost["SIGKILL trainer"], timeline
