"""A script in script mode survives a host loss: SIGKILL the worker running examples/digits-script mid-run; the job
resumes on another host from the last checkpoint the script committed through kiln's client, and its final step,
loss and held-out accuracy equal those of an uninterrupted twin.

Real PostgreSQL, real Redis, two `python -m workers` processes as two hosts, the script on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from core.models import Attempt, JobMetric
from core.settings import get_settings
from harness.workers_cluster import ROOT, Cluster, cluster_on_new_database, upload_code
from tests.support.cluster_rows import job_events, job_row
from tests.support.failover import sigkill_the_host_mid_run_beside_a_twin

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXAMPLE = ROOT / "examples" / "digits-script"


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_script_failover", lease_s=8.0) as c:
        yield c


def script_spec(c: Cluster, name: str) -> int:
    """examples/digits-script/job.yaml, its code uploaded as `kiln submit --workdir` uploads it; paced (the script's
    own --pace) so that the kill lands mid-run."""
    spec = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec.update(name=name, steps=60, checkpointing={"keep_last": 3})
    spec["command"] = ["python", "train.py", "--every", "10", "--pace", "0.15"]
    with c.sessionmaker()() as db:
        spec["code"] = {"digest": upload_code(db, spec["team"], EXAMPLE)}
        db.commit()
    return c.submit_job(spec)


def test_sigkill_mid_run_resumes_the_script_from_its_checkpoint_and_matches_its_twin(two_hosts: Cluster) -> None:
    c = two_hosts
    maker = c.sessionmaker()
    victim, reference = sigkill_the_host_mid_run_beside_a_twin(c, lambda name: script_spec(c, name))

    job, ref = job_row(c, victim), job_row(c, reference)
    assert job.state == "SUCCEEDED", job.exit_reason
    assert ref.state == "SUCCEEDED", ref.exit_reason
    assert job.restart_count == 1
    assert job.last_step == ref.last_step == 60
    assert job.last_loss is not None and job.last_loss == pytest.approx(ref.last_loss, rel=1e-6, abs=1e-6)
    assert job.eval_metrics is not None and ref.eval_metrics is not None
    assert job.eval_metrics["metrics"]["accuracy"] == pytest.approx(ref.eval_metrics["metrics"]["accuracy"])

    with maker() as db:
        attempts = list(db.scalars(select(Attempt).where(Attempt.job_id == victim).order_by(Attempt.number)))
        steps = set(db.scalars(select(JobMetric.step).where(JobMetric.job_id == victim)))
    assert [a.state for a in attempts] == ["LOST", "SUCCEEDED"]
    resumed = attempts[1].resumed_from_step
    assert resumed is not None and resumed >= 10 and resumed % 10 == 0  # a checkpoint the script committed
    assert {resumed + 1, 60} <= steps  # the resumed attempt reported its steps from the next one on
    assert [e.data["step"] for e in job_events(c, victim, "RESUMED")] == [resumed]
    logs = get_settings().resolved_storage_dir / "logs" / str(victim)
    assert f"resumed from step {resumed}" in (logs / "2.log").read_text()
