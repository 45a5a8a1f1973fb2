"""A team's code is hostile, on the production path (real PostgreSQL and Redis, a `python -m workers` process as root)
with no setting at all: the worker sandboxes every attempt (workers/sandbox.py) as its team's own uid. A hostile
recipe trying everything of ``hostile/attacks.py`` is denied each attack (the job fails with the OS's refusals as
the user's own error, no restart) and nothing of the other team changes; one that hoards memory is stopped by its
own memory group, the host and the other attempts untouched. tests/security/test_sandbox_kiln_up.py does the same
on `kiln up`'s embedded default, with a script too."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.models import Job
from core.settings import get_settings
from harness.workers_cluster import ROOT, Cluster, cluster_on_new_database, tiny_spec, upload_code, wait_for
from tests.support.cluster_rows import job_row
from workers.isolation import CGROUP_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

MiB = 1 << 20
HOSTILE = Path(__file__).parent / "hostile"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Cluster]:
    if os.geteuid() != 0 or not (CGROUP_ROOT / "memory").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("the hostile-code tests run as root on a host with cgroup v1 memory and pids controllers")
        pytest.skip("needs root and cgroup v1 memory/pids controllers")
    base = Path(tempfile.mkdtemp(prefix="kiln-hostile-"))
    env = {"KILN_STORAGE_DIR": str(base / "storage"), "KILN_LOCAL_TIER_DIR": ""}
    try:
        with cluster_on_new_database(tmp_path, "kiln_hostile", lease_s=8.0, extra_env=env) as c:
            yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def hostile_job(c: Cluster, name: str, attack: str, target: str = "", **resources: Any) -> int:
    spec: dict[str, Any] = {
        "name": name,
        "team": "attackers",
        "steps": 4,
        "seed": 1,
        "code": {"entry_point": "hostile"},
        "recipe": {"name": "hostile", "hyperparameters": {"attack": attack, "target": target}},
        "resources": {"gpus": 0, "cpu_slots": 1, **resources},
        "compile": {"mode": "off"},
        "precision": "fp32",
        "checkpointing": {"every_steps": 2, "asynchronous": False},
        "sla": {"qos": "silver"},
    }
    with c.sessionmaker()() as db:
        spec["code"]["digest"] = upload_code(db, "attackers", HOSTILE)
        db.commit()
    return c.submit_job(spec, max_restarts=2)


def finished(c: Cluster, *job_ids: int) -> bool:
    return all(job_row(c, j).state in ("SUCCEEDED", "FAILED", "CANCELLED") for j in job_ids)


def targets(c: Cluster, storage: Path, victim: Job) -> dict[str, Any]:
    worker = c.workers[c.host("a")].pid
    return {
        "database": str(storage.parent / "kiln.db"),
        "broker": str(storage.parent / "broker.db"),
        "token_file": str(Path.home() / ".config" / "kiln" / "config.json"),
        "runtime_in_root": [".pyenv"],
        "worker_pid": worker,
        "kiln_pids": [worker, os.getpid()],
        "api_port": 8421,
        "host_addresses": [],
        "gpus": 0,
        "storage": str(storage),
        "victim_checkpoints": str(storage / "checkpoints" / str(victim.id)),
        "victim_artifacts": str(storage / "artifacts" / str(victim.team_id)),
        "victim_run_code": str(storage / "runs" / str(victim.id) / "1" / "code"),
        "victim_dataset_file": str(storage / "datasets" / "victims" / "x"),
        "victim_log": str(storage / "logs" / str(victim.id) / "1.log"),
        "own_dataset_dir": "/datasets/none",
        "site_packages": sysconfig.get_paths()["purelib"],
        "kiln_root": str(ROOT),
    }


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
            "all": hostile_job(c, "all", "all", json.dumps(targets(c, storage, job_row(c, victim)))),
            "memory": hostile_job(c, "memory", "memory", host_memory_bytes=256 * MiB),
        }
        wait_for(lambda: finished(c, *attacks.values()), 300, "every attack ended")
    finally:
        sched.stop()

    jobs: dict[str, Job] = {name: job_row(c, job_id) for name, job_id in attacks.items()}
    report = {name: (j.state, j.restart_count, j.exit_reason) for name, j in jobs.items()}
    log = (storage / "logs" / str(attacks["all"]) / "1.log").read_text()
    assert report["all"][:2] == ("FAILED", 0) and "kiln denied all" in (report["all"][2] or ""), (report, log)
    assert "(hostile.py:" in (report["all"][2] or "") or "(attacks.py:" in (report["all"][2] or ""), report
    assert "SUCCEEDED " not in log and log.count("DENIED ") == 17, log
    assert report["memory"][0] == "FAILED" and "out of host memory" in (report["memory"][2] or ""), report

    # Each attempt ran as its team's own uid, in directories only that uid may enter, and left nothing running.
    team_uid = (storage / "checkpoints" / str(attacks["all"])).stat().st_uid
    run_dir = storage / "runs" / str(attacks["all"]) / "1"
    st = run_dir.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (team_uid, team_uid, 0o700) and team_uid >= 0x7000_0000
    assert (checkpoints.stat().st_mode & 0o777) == 0o700 and checkpoints.stat().st_uid != team_uid
    assert f"running as uid {team_uid}" in log and "sandboxed (bubblewrap)" in log
    assert not [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"].real == team_uid]

    # Nothing of the other team changed.
    assert tree_digest(checkpoints) == before
    assert not (checkpoints / "planted.txt").exists() and not (storage / "planted.txt").exists()
    assert "sandbox: bubblewrap" in c.log_text(c.host("a"))
