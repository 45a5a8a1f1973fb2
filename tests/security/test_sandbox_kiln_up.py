"""A hostile member on the default deployment: `kiln up` as root with no setting at all (SQLite, the broker file, the
admin's token in its CLI config), another team's job with its code, dataset, checkpoints and log, and then the
attacker's recipe and script, each trying everything of ``hostile/attacks.py`` with every path and pid it could
want: kiln's database, broker and token files, the worker's environment, the other team's files, kiln's runtime,
signals and ptrace on kiln's processes, the network, GPUs, root, a process left behind.

Every attack is denied (each job fails with "kiln denied all N attacks", the user's own error, no restart), and
nothing of the other team or of kiln changes (digests before and after); the script's own work (a checkpoint through
kiln's client, as its team's uid) still commits, and no process of the attacker's uid outlives its attempts."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.e2e.test_kiln_up import ROOT, Up, _finished, up_running
from workers.sandbox import runtime_paths

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HOSTILE = Path(__file__).parent / "hostile"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the sandbox's security tests run as root in CI")
        pytest.skip("needs root (the CI runs as root)")
    with up_running(tmp_path) as running:
        yield running


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def ok(up: Up, *args: str) -> str:
    done = up.kiln(*args, timeout=120)
    assert done.returncode == 0, f"kiln {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done.stdout


def submit(up: Up, tmp_path: Path, spec: dict[str, Any], workdir: Path) -> str:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = ok(up, "submit", str(path), "--workdir", str(workdir), "-o", "json")
    return str(json.loads(out)["id"])


def team_with_dataset(up: Up, team: str, storage: Path, name: str) -> Path:
    ok(up, "teams", "create", team, "--quota", "cpu=2")
    ok(up, "teams", "set", team, "--qos", "silver")
    data = storage / "datasets" / team / name
    data.mkdir(parents=True)
    (data / "data.bin").write_bytes(os.urandom(4096))
    ok(up, "datasets", "add", name, f"datasets/{team}/{name}", "--team", team)
    return data


def kiln_pids(up: Up) -> list[int]:
    return [up.proc.pid, *(p.pid for p in psutil.Process(up.proc.pid).children(recursive=True)), os.getpid()]


def test_a_hostile_recipe_and_script_are_denied_everything(up: Up, tmp_path: Path) -> None:
    storage = up.home / "storage"
    victim_data = team_with_dataset(up, "victims", storage, "vdata")
    own_data = team_with_dataset(up, "attackers", storage, "adata")
    victim_spec = yaml.safe_load((ROOT / "examples" / "digits" / "job.yaml").read_text())
    victim_spec |= {"name": "victim", "team": "victims", "steps": 20, "datasets": ["vdata"]}
    victim_spec["checkpointing"]["every_steps"] = 10
    victim = submit(up, tmp_path, victim_spec, ROOT / "examples" / "digits")
    assert _finished(up, victim)["state"] == "SUCCEEDED", up.logs()
    victim_team = team_id(up, "victims")

    listener = socket.create_server(("0.0.0.0", 0))  # something the host's network would answer on
    host_ip = next(
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    )
    runtime, _ = runtime_paths(())
    targets = {
        "database": str(up.home / "kiln.db"),
        "broker": str(up.home / "broker.db"),
        "token_file": str(Path(up.env["XDG_CONFIG_HOME"]) / "kiln" / "config.json"),
        "runtime_in_root": sorted({p.parts[2] for p in runtime if p.parts[1:2] == ("root",) and len(p.parts) > 2}),
        "worker_pid": up.proc.pid,
        "kiln_pids": kiln_pids(up),
        "api_port": int(up.url.rsplit(":", 1)[1]),
        "host_addresses": [[host_ip, listener.getsockname()[1]]],
        "gpus": 0,
        "storage": str(storage),
        "victim_checkpoints": str(storage / "checkpoints" / victim),
        "victim_artifacts": str(storage / "artifacts" / str(victim_team)),
        "victim_run_code": str(storage / "runs" / victim / "1" / "code"),
        "victim_dataset_file": str(victim_data / "data.bin"),
        "victim_log": str(storage / "logs" / victim / "1.log"),
        "own_dataset_dir": "/datasets/adata",
        "site_packages": sysconfig.get_paths()["purelib"],
        "kiln_root": str(ROOT),
    }
    watched = {
        "checkpoints": storage / "checkpoints" / victim,
        "artifacts": storage / "artifacts" / str(victim_team),
        "victim dataset": victim_data,
        "own dataset": own_data,
        "logs": storage / "logs" / victim,
        "venv": Path(sysconfig.get_paths()["purelib"]),
        "config": Path(up.env["XDG_CONFIG_HOME"]),
    }
    site = Path(sysconfig.get_paths()["purelib"])

    def runtime() -> tuple[list[str], dict[str, str]]:  # kiln's virtualenv: what a .pth or module planted changes
        return sorted(os.listdir(site)), {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in site.glob("*.pth")
        }

    before = {name: tree_digest(path) for name, path in watched.items()}
    runtime_before = runtime()
    assert before["checkpoints"] and before["artifacts"] and before["logs"]

    common = {
        "team": "attackers",
        "steps": 4,
        "seed": 1,
        "datasets": ["adata"],
        "resources": {"gpus": 0, "cpu_slots": 1},
        "sla": {"qos": "silver"},
    }
    recipe = submit(
        up,
        tmp_path,
        common
        | {
            "name": "hostile-recipe",
            "code": {"entry_point": "hostile"},
            "compile": {"mode": "off"},
            "precision": "fp32",
            "recipe": {"name": "hostile", "hyperparameters": {"attack": "all", "target": json.dumps(targets)}},
        },
        HOSTILE,
    )
    script = submit(
        up,
        tmp_path,
        common | {"name": "hostile-script", "command": ["python", "train.py", "all", json.dumps(targets)]},
        HOSTILE,
    )
    commit = submit(up, tmp_path, common | {"name": "commit", "command": ["python", "train.py", "commit"]}, HOSTILE)
    ended = {name: _finished(up, job) for name, job in (("recipe", recipe), ("script", script), ("commit", commit))}
    listener.close()

    for name in ("recipe", "script"):
        job = ended[name]
        log = (storage / "logs" / str(job["id"]) / "1.log").read_text()
        assert "SUCCEEDED " not in log, log
        assert (job["state"], job["restart_count"]) == ("FAILED", 0), (job, log)
        assert "kiln denied all" in str(job["exit_reason"]), (job, log)
        assert log.count("DENIED ") == 17, log
    assert ended["commit"]["state"] == "SUCCEEDED", ended["commit"]
    own = storage / "checkpoints" / commit
    assert (own / "step_00000004" / "state.txt").read_text() == "mine"
    team_uid = own.stat().st_uid
    assert team_uid >= 0x7000_0000 and (own.stat().st_mode & 0o777) == 0o700  # the team's own uid, kiln's range
    assert f"uid {team_uid} gid {team_uid}" in (storage / "logs" / commit / "1.log").read_text()

    assert {name: tree_digest(path) for name, path in watched.items()} == before
    assert runtime() == runtime_before
    left = [p.info for p in psutil.process_iter(["pid", "uids", "cmdline"]) if p.info["uids"].real == team_uid]
    assert not left, left

    # As if out of its namespaces: the attacker's uid, on the host itself, opens none of the other team's or kiln's
    # files (each team's directories are its uid's, 0700; kiln's are kiln's), even with every directory above the
    # storage root open to it, as a shared filesystem's mount point is.
    own = [storage / "datasets" / "attackers", storage / "artifacts" / str(team_id(up, "attackers"))]
    own += [
        storage / d / job for job in (recipe, script, commit) for d in ("runs", "logs", "checkpoints", "compile_cache")
    ]
    others = [p for p in up.home.rglob("*") if p.is_file() and not any(p.is_relative_to(o) for o in own)]
    assert len(others) > 20 and any(p.is_relative_to(storage / "checkpoints" / victim) for p in others)
    opened = [(d, d.stat().st_mode) for d in storage.parents if not d.stat().st_mode & 0o001]
    try:
        for d, mode in opened:
            d.chmod(mode | 0o001)
        assert readable_by(team_uid, others) == []
        mine = storage / "checkpoints" / commit / "step_00000004" / "state.txt"
        assert readable_by(team_uid, [mine]) == [str(mine)]  # the check can say yes: its own files
    finally:
        for d, mode in opened:
            d.chmod(mode)


def team_id(up: Up, team: str) -> int:
    return int(json.loads(ok(up, "teams", "show", team, "-o", "json"))["id"])


def readable_by(uid: int, paths: list[Path]) -> list[str]:
    """Which of ``paths`` a process of ``uid`` (no groups, no capabilities) can open, outside any sandbox."""
    script = (
        "import sys\n"
        "for p in sys.stdin.read().split('\\0'):\n"
        "    try: open(p, 'rb').read(1); print(p)\n"
        "    except OSError: pass"
    )
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
            "/usr/bin/python3",
            "-c",
            script,
        ],
        input="\0".join(str(p) for p in paths),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()
