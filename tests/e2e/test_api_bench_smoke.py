"""``bench/api_bench.py --smoke`` (``make bench-api ARGS=--smoke``): the API bench runs on main, against real
PostgreSQL, Redis and uvicorn, and every request it makes is answered (issue 42, point 9: its team had no QoS classes
since per-team QoS, so every submission was refused with 403, and the Redis phase then divided by zero). Its speed is
the full run's business, not this test's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_make_bench_api_runs_the_api_bench() -> None:
    planned = subprocess.run(["make", "-n", "bench-api", "ARGS=--smoke"], cwd=ROOT, capture_output=True, text=True)
    assert planned.returncode == 0 and "bench/api_bench.py --smoke" in planned.stdout, planned.stdout + planned.stderr


def test_the_api_bench_smoke_submits_and_lists_against_the_bare_app(tmp_path: Path) -> None:
    out = tmp_path / "api_bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    done = subprocess.run(
        [sys.executable, "bench/api_bench.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["smoke"] and got["errors"] == {}, got["errors"]
    for name in ("kiln", "bare", "kiln_redis_limiter"):
        assert got[name]["submit"]["requests"] > 0 and got[name]["list"]["requests"] > 0, (name, got[name])
    assert math.isfinite(got["ratio"]["submit_per_s"]) and got["ratio"]["submit_per_s"] > 0, got["ratio"]
