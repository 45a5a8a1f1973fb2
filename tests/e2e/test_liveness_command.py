"""``python -m core.liveness``, the command a container healthcheck runs, as a process of its own: the file named by
the environment or the command line, healthy, stale, or no file named. How long it takes: bench/liveness_bench.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.liveness import Pulse

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def run_check(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **environ}
    return subprocess.run([sys.executable, "-m", "core.liveness", *args], capture_output=True, text=True, env=env)


def test_the_healthcheck_command_reads_the_file_named_by_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "alive.json"
    assert run_check(KILN_LIVENESS_FILE=str(path)).returncode == 1
    Pulse(path, 1.0).beat("heartbeat")
    ok = run_check(KILN_LIVENESS_FILE=str(path))
    assert ok.returncode == 0 and ok.stdout.startswith("heartbeat: last beat")
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "at": record["at"] - 1.0}))  # the beat a second old, without waiting
    stale = run_check(str(path), "--max-age", "0.2")
    assert stale.returncode == 1 and "stale after 0 s" in stale.stderr
    unset = run_check()
    assert unset.returncode == 2 and "KILN_LIVENESS_FILE is not set" in unset.stderr


def test_the_liveness_bench_runs_the_command(tmp_path: Path) -> None:
    out = tmp_path / "liveness.json"
    done = subprocess.run(
        [sys.executable, "bench/liveness_bench.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(out.read_text())
    assert got["smoke"] and got["runs"] == 3 and 0 < got["median_s"] <= got["max_s"]
