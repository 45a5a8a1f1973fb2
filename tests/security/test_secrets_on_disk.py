"""Secrets and a team's work stay the owner's on disk: no token in a log, nothing readable by other users.

Before: ``kiln up --detach`` wrote the admin token into its world-readable log, and the SQLite database (token
hashes, every team's jobs) and the attempt logs were world-readable (0644)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from harness.dashboard import ROOT, free_port
from harness.services import process_tree
from workers.supervisor import TrainerProcess


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.e2e
def test_kiln_up_detached_keeps_its_secrets(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_HOME=str(home), XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONUNBUFFERED="1")

    def kiln(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200
        )

    old = os.umask(0o022)  # a usual login's umask: kiln must not rely on a strict one
    try:
        up = kiln("up", "--detach", "--port", str(port), "--no-worker", "--grace", "20")
    finally:
        os.umask(old)
    pid = int((home / "up.lock").read_text() or 0)
    # Handles taken while it runs: they never signal another process that got one of its pids later.
    procs = process_tree(pid) if up.returncode == 0 else []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        token = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"]
        logs = sorted((home / "logs").glob("*.log"))
        assert {p.name for p in logs} >= {"up.log", "api.log", "scheduler.log"}
        for log in logs:
            assert token not in log.read_text(), log.name
        # Printed to whoever ran kiln up --detach, a pipe here (README, the sign-in page; issue 42, point 6), and
        # never into kiln's own up.log, which says where it is instead.
        assert f"dashboard sign-in token (also in the CLI config): {token}" in up.stdout, up.stdout
        assert "dashboard sign-in token: in the CLI config" in (home / "logs" / "up.log").read_text()
        private = [home, home / "logs", *logs, *home.glob("*.db*")]
        assert any(p.name == "kiln.db" for p in private)
        for path in private:
            assert mode(path) & 0o077 == 0, f"{path}: {oct(mode(path))}"
    finally:
        if kiln("down").returncode != 0:
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.kill()


@pytest.mark.parametrize("gid", [None, os.getgid()])
def test_attempt_logs_are_the_workers_or_the_storage_groups(tmp_path: Path, gid: int | None) -> None:
    log = tmp_path / "storage" / "logs" / "7" / "1.log"
    proc = TrainerProcess(
        [sys.executable, "-c", "print('step 1')"],
        env=os.environ,
        log_path=log,
        run_dir=tmp_path / "run",
        cwd=tmp_path,
        log_gid=gid,
    )
    old = os.umask(0o022)
    try:
        proc.start()
        assert proc.wait(30) == 0
    finally:
        os.umask(old)
    assert "step 1" in log.read_text()
    if gid is None:
        assert (mode(log), mode(log.parent)) == (0o600, 0o700)
    else:  # the API's group may read it (KILN_STORAGE_GID); nobody else
        assert (mode(log), mode(log.parent), log.stat().st_gid) == (0o640, 0o750, gid)
    assert mode(tmp_path / "run") == 0o700
