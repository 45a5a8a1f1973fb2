"""A team's code is untrusted: run as its team's own unprivileged user (workers/attempt_user.py) inside its own
cgroups, a hostile recipe cannot read another team's checkpoints or logs, write outside its own directories,
read the worker's environment, regain root, leave a process behind or take the host's memory. Each attempt ends
with a clear reason (the OS's refusal, as the user's error: no restart), and nothing of the other team changes.

Real PostgreSQL, Redis, a `python -m workers` process as root, the real trainer on CPU."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.models import Job
from core.settings import get_settings
from tests.support.cluster_rows import job_row
from tests.support.workers_cluster import ROOT, Cluster, cluster_on_new_database, tiny_spec, upload_code, wait_for
from workers.isolation import CGROUP_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

UID_BASE = 61000
MiB = 1 << 20
HOSTILE = Path(__file__).parent / "hostile"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Cluster]:
    if os.geteuid() != 0 or not (CGROUP_ROOT / "memory").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("the hostile-code tests run as root on a host with cgroup v1 memory and pids controllers")
        pytest.skip("needs root and cgroup v1 memory/pids controllers")
    # The attempts' user must be able to reach the storage: a directory under /tmp (pytest's own is root's 0700);
    # and kiln's interpreter and code: a fresh clone may sit under a 0700 directory (mkdtemp), which a production
    # host would not do. Traverse-only (o+x) for the test, put back afterwards.
    opened = _traversable([Path(sys.executable), Path(sys.executable).resolve(), Path(sys.base_prefix), ROOT])
    base = Path(tempfile.mkdtemp(prefix="kiln-hostile-"))
    os.chmod(base, 0o711)
    env = {"KILN_ATTEMPT_UID_BASE": str(UID_BASE), "KILN_STORAGE_DIR": str(base / "storage"), "KILN_LOCAL_TIER_DIR": ""}
    try:
        with cluster_on_new_database(tmp_path, "kiln_hostile", lease_s=8.0, extra_env=env) as c:
            yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for directory, mode in opened:
            os.chmod(directory, mode)


def _traversable(paths: list[Path]) -> list[tuple[Path, int]]:
    """Give others traverse (not read) permission on every ancestor directory of ``paths`` that lacks it."""
    opened: list[tuple[Path, int]] = []
    for path in paths:
        for directory in [path, *path.parents] if path.is_dir() else path.parents:
            mode = directory.stat().st_mode & 0o7777
            if not mode & 0o001 and directory not in {d for d, _ in opened}:
                os.chmod(directory, mode | 0o001)
                opened.append((directory, mode))
    return opened


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def hostile_job(c: Cluster, name: str, attack: str, target: str = "", **resources: Any) -> int:
    spec: dict[str, Any] = {
        "name": name, "team": "attackers", "steps": 4, "seed": 1,
        "code": {"entry_point": "hostile"},
        "recipe": {"name": "hostile", "hyperparameters": {"attack": attack, "target": target, "heartbeat_s": 0.5}},
        "resources": {"gpus": 0, "cpu_slots": 1, **resources}, "compile": {"mode": "off"}, "precision": "fp32",
        "checkpointing": {"every_steps": 2, "asynchronous": False}, "sla": {"qos": "silver"},
    }  # fmt: skip
    with c.sessionmaker()() as db:
        spec["code"]["digest"] = upload_code(db, "attackers", HOSTILE)
        db.commit()
    return c.submit_job(spec, max_restarts=2)


def finished(c: Cluster, *job_ids: int) -> bool:
    return all(job_row(c, j).state in ("SUCCEEDED", "FAILED", "CANCELLED") for j in job_ids)


def test_a_hostile_recipe_is_denied_or_contained(host: Cluster) -> None:
    c = host
    c.start_worker("a", cpu_slots=2)
    storage = get_settings().resolved_storage_dir
    victim = c.submit_job(tiny_spec("victim", steps=10, every_steps=5) | {"team": "victims"})
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: finished(c, victim), 150, "the victim's job finished")
        assert job_row(c, victim).state == "SUCCEEDED", job_row(c, victim).exit_reason
        checkpoints = storage / "checkpoints" / str(victim)
        before = tree_digest(checkpoints)
        assert before, "the victim has checkpoints"
        attacks = {
            "read-checkpoint": hostile_job(c, "read-ckpt", "read-checkpoint", str(checkpoints)),
            "write-outside": hostile_job(c, "write-out", "write-outside", str(checkpoints)),
            "write-storage": hostile_job(c, "write-storage", "write-outside", str(storage)),
            "worker-environment": hostile_job(c, "environ", "worker-environment"),
            "read-log": hostile_job(c, "read-log", "read-file", str(storage / "logs" / str(victim) / "1.log")),
            "setuid": hostile_job(c, "setuid", "setuid"),
            "daemon": hostile_job(c, "daemon", "daemon"),
            "memory": hostile_job(c, "memory", "memory", host_memory_bytes=256 * MiB),
        }
        wait_for(lambda: finished(c, *attacks.values()), 300, "every attack ended")
    finally:
        sched.stop()

    jobs: dict[str, Job] = {name: job_row(c, job_id) for name, job_id in attacks.items()}
    report = {name: (j.state, j.restart_count, j.exit_reason) for name, j in jobs.items()}
    for name in ("read-checkpoint", "write-outside", "write-storage", "worker-environment", "read-log", "setuid"):
        state, restarts, reason = report[name]
        assert (state, restarts) == ("FAILED", 0), report
        assert "PermissionError" in (reason or "") and "ATTACK SUCCEEDED" not in (reason or ""), report
        assert "(hostile.py:" in (reason or ""), report  # the user's own line, as the job's reason
    assert report["memory"][0] == "FAILED" and "out of host memory" in (report["memory"][2] or ""), report

    # The daemon the attack left was killed with its attempt's cgroups; the attempt itself trained to the end.
    assert report["daemon"][0] == "SUCCEEDED", report
    run_dir = storage / "runs" / str(attacks["daemon"]) / "1"
    daemon_pid = int((run_dir / "tmp" / "daemon.pid").read_text())
    assert not psutil.pid_exists(daemon_pid) or psutil.Process(daemon_pid).status() == psutil.STATUS_ZOMBIE

    # Each attempt ran as its team's own user, in directories only that user may enter.
    team_id = jobs["daemon"].team_id
    st = run_dir.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (UID_BASE + team_id, UID_BASE + team_id, 0o700)
    assert (checkpoints.stat().st_mode & 0o777) == 0o700 and checkpoints.stat().st_uid != UID_BASE + team_id
    log = (storage / "logs" / str(attacks["daemon"]) / "1.log").read_text()
    assert f"running as uid {UID_BASE + team_id}" in log and "no_new_privs" in log

    # Nothing of the other team changed.
    assert tree_digest(checkpoints) == before
    assert not (checkpoints / "planted.txt").exists() and not (storage / "planted.txt").exists()
    assert "attempt users: each team's attempts run as uid/gid" in c.log_text(c.host("a"))
