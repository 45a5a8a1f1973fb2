"""Script mode goes through the same isolation as a recipe (workers/attempt_user.py, workers/isolation.py): the
script runs as its team's own unprivileged user, commits its checkpoints through kiln's client into its own 0700
directory, cannot read another team's checkpoints (its PermissionError is its own error: FAILED, no restart), and
the daemon it leaves behind is gone when its attempt ends.

Real PostgreSQL, Redis, a `python -m workers` process as root, scripts on the CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.settings import get_settings
from tests.security.test_hostile_code import UID_BASE, finished, host  # noqa: F401 - the fixture
from tests.support.cluster_rows import job_row
from tests.support.workers_cluster import ROOT, Cluster, SchedulerThread, submit, upload_code, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

HOSTILE = Path(__file__).parent / "hostile_script"
EXAMPLE = ROOT / "examples" / "digits-script"


def script_job(c: Cluster, team: str, directory: Path, command: list[str], name: str) -> int:
    spec: dict[str, Any] = {"name": name, "team": team, "command": command, "steps": 20, "seed": 1,
                            "resources": {"gpus": 0, "cpu_slots": 1}, "checkpointing": {"keep_last": 2}}  # fmt: skip
    with c.sessionmaker()() as db:
        spec["code"] = {"digest": upload_code(db, team, directory)}
        job = submit(db, spec, max_restarts=2)
        db.commit()
        return job.id


def test_a_script_runs_as_its_teams_user_and_is_contained(host: Cluster) -> None:  # noqa: F811
    c = host
    c.start_worker("a", cpu_slots=2)
    storage = get_settings().resolved_storage_dir
    sched = SchedulerThread(c.sessionmaker(), get_settings(), interval_s=0.5).start()
    try:
        victim = script_job(c, "default", EXAMPLE, ["python", "train.py", "--every", "10"], "victim")
        wait_for(lambda: finished(c, victim), 240, "the victim's script finished")
        secret = storage / "checkpoints" / str(victim) / "step_00000020" / "state.pt"
        assert secret.is_file()
        daemon = script_job(c, "attackers", HOSTILE, ["python", "train.py", "daemon"], "daemon")
        reader = script_job(c, "attackers", HOSTILE, ["python", "train.py", "read", str(secret)], "reader")
        wait_for(lambda: finished(c, daemon, reader), 240, "the attackers' scripts finished")
    finally:
        sched.stop()

    assert job_row(c, victim).state == "SUCCEEDED", job_row(c, victim).exit_reason
    # Its own checkpoint, committed through the client as its own user; the daemon it left is gone.
    job = job_row(c, daemon)
    assert job.state == "SUCCEEDED", job.exit_reason
    team_uid = UID_BASE + job.team_id
    log = (storage / "logs" / str(daemon) / "1.log").read_text()
    assert f"running as uid {team_uid}" in log and f"uid {team_uid} gid {team_uid}" in log, log
    own = storage / "checkpoints" / str(daemon)
    assert (own / "step_00000020" / "state.txt").read_text() == "mine"
    assert own.stat().st_uid == team_uid and (own.stat().st_mode & 0o777) == 0o700
    pid = int((storage / "runs" / str(daemon) / "1" / "tmp" / "daemon.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # Another team's checkpoint: the kernel refuses, and that is the script's own error.
    job = job_row(c, reader)
    assert job.state == "FAILED" and job.restart_count == 0, job.exit_reason
    assert job.exit_reason is not None and "PermissionError: [Errno 13] Permission denied" in job.exit_reason
    assert os.stat(secret).st_uid != team_uid
