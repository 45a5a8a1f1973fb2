"""A sweep of a team's own code end to end on `kiln up`: `kiln sweep submit --workdir` uploads examples/digits
once, the worker trains each job, and the sweep's median rule stops the job whose held-out accuracy at a step is
below the median of the others' there, while it runs; `kiln sweep show` ranks the jobs by accuracy and says why."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_kiln_up import JOB_TIMEOUT_S, ROOT, Up

pytestmark = pytest.mark.e2e

DIGITS = ROOT / "examples" / "digits"


def test_the_median_rule_stops_the_worse_job_of_a_sweep_while_it_runs(kiln_up: Up, tmp_path: Path) -> None:
    doc = yaml.safe_load((DIGITS / "sweep.yaml").read_text())
    # Two good learning rates first (one at a time), then a far too small one, as long as they are (1000 steps): its
    # evaluation at step 100 is judged while it still runs because the worker relays an evaluation within a second.
    # A 300-step job had ended, and was not stopped, before its cancellation reached it on a busy CI machine.
    points = [{"lr": 0.003}, {"lr": 0.005}, {"lr": 0.00005}]
    doc["sweep"] = {
        "list": points,
        "max_concurrent": 1,
        "early_stopping": {"min_jobs": 2},
        "objective": {"metric": "accuracy", "goal": "maximize"},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    made = kiln_up.kiln("sweep", "submit", str(path), "--workdir", str(DIGITS))
    assert made.returncode == 0, f"{made.stdout}\n{made.stderr}"
    sweep_id = made.stdout.split()[2]

    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        sweep = json.loads(kiln_up.kiln("sweep", "show", sweep_id, "-o", "json").stdout)
        if all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in sweep["jobs"]):
            break
        assert time.monotonic() < deadline, (sweep, kiln_up.logs())
        time.sleep(1)
    jobs = {j["name"]: j for j in sweep["jobs"]}
    good, worse = [jobs[f"digits-search-{i}"] for i in (0, 1)], jobs["digits-search-2"]
    assert [j["state"] for j in good] == ["SUCCEEDED", "SUCCEEDED"], (sweep, kiln_up.logs())
    assert worse["state"] == "CANCELLED" and worse["last_step"] < 1000, worse
    assert worse["exit_reason"].startswith("stopped early: accuracy "), worse
    assert "worse than the median of the 2 other jobs of sweep" in worse["exit_reason"], worse
    assert [j["name"] for j in sweep["jobs"]][-1] == "digits-search-2"  # best first by accuracy, succeeded first
    shown = kiln_up.kiln("sweep", "show", sweep_id).stdout
    assert "best first by accuracy (maximize)" in shown and "stopped early: accuracy" in shown, shown
