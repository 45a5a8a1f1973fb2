"""``bench/forecast_bench.py --smoke`` (issue 41, acceptance 3's bench on a small synthetic trace), so it does not
rot on main: every limit model and policy replayed, each forecast settled, the figures where the bench's JSON says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_forecast_bench_smoke_measures_both_methods_under_both_limit_models(tmp_path: Path) -> None:
    out = tmp_path / "forecast.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    done = subprocess.run(
        [sys.executable, "bench/forecast_bench.py", "--smoke", "--workers", "1", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["smoke"] and {(r["limits"], r["policy"]) for r in got["runs"]} == {
        (lim, p) for lim in ("overestimating", "underestimating") for p in ("kiln", "easy")
    }
    for run in got["runs"]:
        f = run["forecasts"]
        assert f["settled"] >= 150 and run["replay"]["jobs_finished"] == 150  # every job forecast and started
        assert f["all"]["kiln"]["given"] > 0 and f["all"]["slurm"]["forecasts"] == f["settled"]
        killed = run["replay"]["jobs_killed_at_limit"]
        assert (killed > 0) == (run["limits"] == "underestimating")
    assert "| limits | policy |" in got["table"]
