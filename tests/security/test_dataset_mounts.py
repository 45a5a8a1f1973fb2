"""A dataset is read-only to the team's attempts (workers/datasets.py): the sandbox binds it read-only, and the
attempt - its team's unprivileged uid, no capabilities - reads it but cannot write into it, unmount it or remount
it writable. Each attempt fails with the kernel's refusal
as the user's error (no restart) and the dataset's files are unchanged.

Real PostgreSQL, Redis, a `python -m workers` process as root, the real trainer on CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from core.models import Dataset
from core.settings import get_settings
from harness.workers_cluster import Cluster, SchedulerThread, _team, submit, upload_code, wait_for
from tests.security.test_hostile_code import finished, host, tree_digest  # noqa: F401 - host is a fixture
from tests.support.cluster_rows import job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

GRABBER = Path(__file__).parent / "hostile_data"


def grab_job(c: Cluster, attack: str) -> int:
    spec: dict[str, Any] = {
        "name": f"grab-{attack}",
        "team": "attackers",
        "steps": 4,
        "seed": 1,
        "code": {"entry_point": "grabber"},
        "datasets": ["shared-data"],
        "recipe": {"name": "grabber", "hyperparameters": {"attack": attack}},
        "resources": {"gpus": 0, "cpu_slots": 1},
        "compile": {"mode": "off"},
        "precision": "fp32",
        "checkpointing": {"every_steps": 2, "asynchronous": False},
        "sla": {"qos": "silver"},
    }
    with c.sessionmaker()() as db:
        spec["code"]["digest"] = upload_code(db, "attackers", GRABBER)
        job = submit(db, spec, max_restarts=2)
        db.commit()
        return job.id


def test_a_dataset_is_read_only_to_its_teams_unprivileged_attempts(host: Cluster) -> None:  # noqa: F811
    c = host
    storage = get_settings().resolved_storage_dir
    data = storage / "datasets" / "_shared" / "data"
    data.mkdir(parents=True)
    (data / "data.bin").write_bytes(b"payload")
    os.chmod(data / "data.bin", 0o666)  # even a file the attempt's user could write: the mount refuses it
    os.chmod(data, 0o777)
    before = tree_digest(data)
    with c.sessionmaker()() as db:
        db.add(Dataset(team_id=_team(db, "attackers").id, name="shared-data", path="datasets/_shared/data"))
        db.commit()
    c.start_worker("a", cpu_slots=2)
    sched = SchedulerThread(c.sessionmaker(), get_settings(), interval_s=0.5).start()
    try:
        jobs = {attack: grab_job(c, attack) for attack in ("read", "write", "umount", "remount")}
        wait_for(lambda: finished(c, *jobs.values()), 300, "every attempt ended")
    finally:
        sched.stop()
    report = {a: (job_row(c, j).state, job_row(c, j).restart_count, job_row(c, j).exit_reason) for a, j in jobs.items()}
    assert report["read"][:2] == ("SUCCEEDED", 0), report
    write_state, write_restarts, write_reason = report["write"]
    assert (write_state, write_restarts) == ("FAILED", 0), report
    assert "Read-only file system" in (write_reason or "") and "(grabber.py:" in (write_reason or ""), report
    for attack in ("umount", "remount"):
        state, restarts, reason = report[attack]
        assert (state, restarts) == ("FAILED", 0), report
        assert "PermissionError" in (reason or "") and "ATTACK SUCCEEDED" not in (reason or ""), report
    assert tree_digest(data) == before and sorted(os.listdir(data)) == ["data.bin"]
    log = (storage / "logs" / str(jobs["read"]) / "1.log").read_text()
    assert "running as uid" in log and "datasets shared-data bound read-only under /datasets" in log, log
    assert "sandbox: bubblewrap" in c.log_text(c.host("a"))
