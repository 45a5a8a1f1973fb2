"""Script mode goes through the same sandbox as a recipe (workers/sandbox.py), with no setting at all: the script
runs as its team's own uid, commits its checkpoints through kiln's client into its own 0700 directory, cannot read
another team's checkpoints (its refusal is its own error: FAILED, no restart), and the daemon it leaves behind is
gone when its attempt ends.

Real PostgreSQL, Redis, a `python -m workers` process as root, scripts on the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.settings import get_settings
from harness.workers_cluster import ROOT, Cluster, SchedulerThread, submit, upload_code, wait_for
from tests.security.test_hostile_code import finished, host, targets  # noqa: F401 - the fixture
from tests.support.cluster_rows import job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

HOSTILE = Path(__file__).parent / "hostile"
EXAMPLE = ROOT / "examples" / "digits-script"


def script_job(c: Cluster, team: str, directory: Path, command: list[str], name: str) -> int:
    spec: dict[str, Any] = {
        "name": name,
        "team": team,
        "command": command,
        "steps": 20,
        "seed": 1,
        "resources": {"gpus": 0, "cpu_slots": 1},
        "checkpointing": {"keep_last": 2},
    }
    with c.sessionmaker()() as db:
        spec["code"] = {"digest": upload_code(db, team, directory)}
        job = submit(db, spec, max_restarts=2)
        db.commit()
        return job.id


def test_a_script_runs_as_its_teams_uid_and_is_contained(host: Cluster) -> None:  # noqa: F811
    c = host
    c.start_worker("a", cpu_slots=2)
    storage = get_settings().resolved_storage_dir
    sched = SchedulerThread(c.sessionmaker(), get_settings(), interval_s=0.5).start()
    try:
        victim = script_job(c, "default", EXAMPLE, ["python", "train.py", "--every", "10"], "victim")
        wait_for(lambda: finished(c, victim), 240, "the victim's script finished")
        secret = storage / "checkpoints" / str(victim) / "step_00000020" / "state.pt"
        assert secret.is_file()
        aims = json.dumps(targets(c, storage, job_row(c, victim)))
        commit = script_job(c, "attackers", HOSTILE, ["python", "train.py", "commit"], "commit")
        attack = script_job(c, "attackers", HOSTILE, ["python", "train.py", "all", aims], "attack")
        wait_for(lambda: finished(c, commit, attack), 240, "the attackers' scripts finished")
    finally:
        sched.stop()

    assert job_row(c, victim).state == "SUCCEEDED", job_row(c, victim).exit_reason
    # Its own checkpoint, committed through the client as its own uid; the daemon it left is gone.
    job = job_row(c, commit)
    assert job.state == "SUCCEEDED", job.exit_reason
    own = storage / "checkpoints" / str(commit)
    team_uid = own.stat().st_uid
    log = (storage / "logs" / str(commit) / "1.log").read_text()
    assert f"running as uid {team_uid}" in log and f"uid {team_uid} gid {team_uid}" in log, log
    assert (own / "step_00000020" / "state.txt").read_text() == "mine"
    assert (own.stat().st_mode & 0o777) == 0o700 and team_uid >= 0x7000_0000
    assert not [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"].real == team_uid]
    # Everything else: denied, and that is the script's own error.
    job = job_row(c, attack)
    log = (storage / "logs" / str(attack) / "1.log").read_text()
    assert job.state == "FAILED" and job.restart_count == 0, (job.exit_reason, log)
    assert job.exit_reason is not None and "kiln denied all" in job.exit_reason, log
    assert "SUCCEEDED " not in log and log.count("DENIED ") == 17, log
    assert os.stat(secret).st_uid != team_uid
