"""A team's own code survives a host loss: SIGKILL the worker running the digits CNN mid-run; the job resumes on
another host with the same code digest from its last verified checkpoint, and its final loss and held-out
metrics equal those of an uninterrupted twin.

Real PostgreSQL, real Redis, two `python -m workers` processes as two hosts, the real trainer on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from core.models import Attempt
from core.settings import get_settings
from harness.workers_cluster import ROOT, Cluster, cluster_on_new_database, slow_steps, upload_code
from tests.support.cluster_rows import matched_its_twin
from tests.support.failover import sigkill_the_host_mid_run_beside_a_twin

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_on_new_database(tmp_path, "kiln_usercode_failover", lease_s=8.0) as c:
        yield c


def digits_spec(c: Cluster, name: str) -> dict[str, object]:
    """examples/digits/job.yaml, its code uploaded as `kiln submit --workdir` uploads it."""
    spec = yaml.safe_load((ROOT / "examples" / "digits" / "job.yaml").read_text())
    spec.update(name=name, steps=60, checkpointing={"every_steps": 10, "keep_last": 3, "asynchronous": False})
    spec["recipe"]["hyperparameters"]["heartbeat_s"] = 0.5
    with c.sessionmaker()() as db:
        spec["code"]["digest"] = upload_code(db, spec["team"], ROOT / "examples" / "digits")
        db.commit()
    spec["id"] = c.submit_job(spec)
    return spec


def test_sigkill_mid_run_resumes_the_same_code_and_matches_its_twin(two_hosts: Cluster) -> None:
    c = two_hosts
    maker = c.sessionmaker()
    specs: dict[str, dict[str, object]] = {}

    def submit_digits(name: str) -> int:
        specs[name] = digits_spec(c, name)
        return int(specs[name]["id"])  # type: ignore[call-overload]

    victim, reference = sigkill_the_host_mid_run_beside_a_twin(c, submit_digits, hooks=slow_steps(0.15))
    victim_spec = specs["victim"]

    job, ref = matched_its_twin(c, victim, reference, steps=60)
    assert job.eval_metrics is not None and ref.eval_metrics is not None
    assert job.eval_metrics["step"] == 60
    for name, value in ref.eval_metrics["metrics"].items():
        assert job.eval_metrics["metrics"][name] == pytest.approx(value, rel=1e-6, abs=1e-6), name

    with maker() as db:
        attempts = list(db.scalars(select(Attempt).where(Attempt.job_id == victim).order_by(Attempt.number)))
    assert [a.state for a in attempts] == ["LOST", "SUCCEEDED"]
    assert attempts[1].resumed_from_step is not None and attempts[1].resumed_from_step >= 10
    digest = victim_spec["code"]["digest"]  # type: ignore[index]
    logs = get_settings().resolved_storage_dir / "logs" / str(victim)
    for number in (1, 2):  # each attempt fetched and verified the same archive
        assert f"code {digest[:12]} (" in (logs / f"{number}.log").read_text()
