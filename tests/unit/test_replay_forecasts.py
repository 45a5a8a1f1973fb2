"""Start-time forecasts measured on a replay (``scheduler.simulate.forecasts``): kiln's projection and Slurm's
method, each held to the start the replay then gives the job."""

from __future__ import annotations

import dataclasses
import math

from core.policy_config import PolicyConfig
from scheduler.simulate.forecasts import ForecastRecorder, errors, summary
from scheduler.simulate.simulation import Simulation
from scheduler.simulate.synthetic import gpu_cluster
from scheduler.simulate.trace import TraceJob

H = 3600.0
GRACE_S = PolicyConfig().time_limit_grace_s


def _replay(limits: list[float | None], *, every: int = 1, progress: bool = False) -> ForecastRecorder:
    """One 8-GPU host; job 1 runs 2 h from t=0, job 2 (8 GPUs, 1 h) is submitted 10 minutes later."""
    trace = [TraceJob("a", 8, 0.0, 2 * H), TraceJob("b", 8, 600.0, H)]
    config = PolicyConfig(preemption=False)  # the second job waits for the first to end, whatever its class
    recorder = ForecastRecorder(config, every=every, progress=progress)
    sim = Simulation(trace, gpu_cluster(1), config, observer=recorder)
    for jid, limit in enumerate(limits, 1):
        sim.jobs[jid].sub = dataclasses.replace(sim.jobs[jid].sub, time_limit_s=limit)
    sim.run("kiln")
    return recorder


def test_kiln_expects_the_use_of_a_limit_and_slurm_the_limit_itself() -> None:
    recorder = _replay([4 * H, 2 * H])
    first, second = sorted(recorder.done, key=lambda f: f.job)
    assert first.at == {"kiln": 0.0, "slurm": 0.0} and first.actual == 0.0  # it started at once: both right
    assert second.actual == 2 * H  # behind the first job, which ran 2 h of its 4 h limit
    # kiln, with no history yet, expects a job to use half of what is left of its limit (estimate.DEFAULT_LIMIT_USE):
    # 5 minutes late here; Slurm's method plans the first job to its limit and the grace.
    assert second.at["kiln"] == 600.0 + (4 * H - 600.0) / 2 == 2 * H + 300.0
    assert second.at["slurm"] == 4 * H + GRACE_S
    got = summary(recorder.done)
    assert got["settled"] == 2 and got["waited"] == 1
    assert got["in_kiln_range"] == 0.5  # the second started 5 minutes before kiln's earliest
    waited = got["waited_only"]
    assert waited["kiln"]["median_abs_h"] == round(300.0 / H, 2)
    assert math.isclose(waited["slurm"]["median_abs_h"], round((2 * H + GRACE_S) / H, 2))
    assert waited["slurm"]["median_signed_h"] > 0  # too late


def test_slurm_gives_no_start_behind_a_job_without_a_limit_and_kiln_still_does() -> None:
    recorder = _replay([None, 2 * H])
    second = next(f for f in recorder.done if f.job == 2)
    assert second.at["slurm"] is None and second.stopped["slurm"] == "unknown"
    assert second.at["kiln"] is not None  # from the team's history, or as long again as it has run
    kiln, slurm = (errors(recorder.done, m) for m in ("kiln", "slurm"))
    assert kiln["given"] == 1.0 and slurm["given"] == 0.5


def test_the_progress_bound_knows_the_running_jobs_true_remaining_time() -> None:
    recorder = _replay([8 * H, 2 * H], progress=True)
    second = next(f for f in recorder.done if f.job == 2)
    assert second.at["kiln+progress"] == 2 * H == second.actual  # exact: its end is known
    assert second.at["kiln"] == 600.0 + (8 * H - 600.0) / 2  # half of what is left of the 8 h limit


def test_every_nth_submission_is_forecast() -> None:
    assert [f.job for f in _replay([4 * H, 2 * H], every=2).done] == [1]
