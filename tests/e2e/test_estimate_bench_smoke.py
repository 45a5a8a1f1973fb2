"""``bench/estimate_bench.py`` (issue 41, acceptance 1 and 4 on a GPU host), so it does not rot on main: its smoke on
the CPU (``kiln up``, a calibration run, a shape predicted before it runs and then measured, the shipped CPU
example's recommendation run against a deadline), and its ``--prior`` arithmetic (another GPU type's runs carried
to this one) on runs written here, since no GPU is at hand."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and x > 0


def test_the_estimate_bench_smoke_predicts_measures_and_runs_the_recommendation(tmp_path: Path) -> None:
    out = tmp_path / "estimate.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_") and k != "OUT"}
    done = subprocess.run(
        [sys.executable, "bench/estimate_bench.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["device"] == "cpu" and set(got["runs"]) == {"tiny", "width96"}
    (shape,) = got["shapes"].values()
    assert _positive(shape["predicted_step_s"]) and _positive(shape["measured_step_s"]), shape
    assert shape["basis"] == "scaled" and isinstance(shape["step_within_15pct"], bool)
    assert shape["step_error"] == pytest.approx(shape["predicted_step_s"] / shape["measured_step_s"] - 1)
    advise = got["advise"]
    assert advise["example"] == "examples/gpt-tiny.yaml" and advise["steps_override"] == 30
    assert _positive(advise["gpu_hours_written"]) and _positive(advise["gpu_hours_recommended"])
    assert advise["queue"]["verdict"] in ("meets", "may miss", "misses", "unknown")
    assert advise["recommended_meets_deadline"] is True and advise["recommended_costs_no_more"] is True
    assert set(got["verdicts"]) == {"device", "width96", "advise"}


def test_the_prior_carries_another_gpu_types_runs_to_this_one(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    bench = importlib.import_module("estimate_bench")
    specs = {
        n: bench.gpt_spec(n, c, steps=60, smoke=False) for n, c in {**bench.GPU_CALIBRATE, **bench.GPU_TEST}.items()
    }
    measured = {"gpt2": 0.05, "width512": 0.03}  # on an H200, seconds a step
    runs = {
        n: {"spec": specs[n], "device": "H200", "steady_step_times": [t] * 40, "median_step_s": t, "startup_s": 30.0}
        | {"peak_bytes": 2**33}
        for n, t in measured.items()
    }
    prior = tmp_path / "h200.json"
    prior.write_text(json.dumps({"runs": runs}))
    got = bench.prior_predictions(prior, specs, "H100-80GB")
    assert got["from"] == ["H200"] and got["to"] == "H100-80GB" and set(got["shapes"]) == set(specs)
    for name, p in got["shapes"].items():
        assert p["basis"] == "scaled from H200" and p["low_s"] <= p["step_s"] <= p["high_s"], (name, p)
    # the same shape: the H100's slower memory makes it slower, by at most the bandwidths' ratio
    assert measured["gpt2"] < got["shapes"]["gpt2"]["step_s"] <= measured["gpt2"] * 4800 / 3350
