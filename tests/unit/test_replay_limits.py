"""The replay's second limit model (limits below the run time: killed, resubmitted) and ``kiln simulate --holdout``."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from core.policy_config import PolicyConfig
from scheduler.simulate import holdout
from scheduler.simulate.limits import (
    LIMIT_LADDER_H,
    OVERESTIMATING,
    RESUBMIT_DELAY_S,
    UNDERESTIMATING,
    model,
    resubmitted_limit,
    rounded_down,
    user_time_limit,
)
from scheduler.simulate.replay import main
from scheduler.simulate.report import summarize
from scheduler.simulate.simulation import Simulation
from scheduler.simulate.synthetic import gpu_cluster
from scheduler.simulate.trace import TraceJob, synthetic_trace

H = 3600.0
GRACE_S = PolicyConfig().time_limit_grace_s


def test_the_underestimating_model_puts_its_share_below_the_run_time_and_leaves_the_others_alone() -> None:
    works = [600.0 * (2 + i % 97) for i in range(4000)]  # above the 10-minute floor
    default = [OVERESTIMATING.draw(f"j{i}", w) for i, w in enumerate(works)]
    under = [UNDERESTIMATING.draw(f"j{i}", w) for i, w in enumerate(works)]
    assert default == [user_time_limit(f"j{i}", w) for i, w in enumerate(works)]  # the default model is today's
    assert [d is None for d in default] == [u is None for u in under]  # the same jobs give no limit
    given = [(w, d, u) for w, d, u in zip(works, default, under, strict=True) if d is not None]
    below = [(w, u) for w, _d, u in given if u is not None and u < w]
    assert 0.12 < len(below) / len(given) < 0.18  # 15% of the jobs with a limit
    assert all(u == d for w, d, u in given if u is not None and u >= w)  # the others keep their limits exactly
    assert not [d for w, d, _u in given if d is not None and d < 1.1 * w]  # and the default never underestimates
    rungs = {h * H for h in LIMIT_LADDER_H}
    assert all(u in rungs or u % 600 == 0 for _w, u in below)  # round figures, rounded down
    assert model("underestimating", 0.5).underestimate_share == 0.5
    assert model("overestimating", 0.5) == OVERESTIMATING  # the share is the underestimating model's only


def test_round_figures_for_limits() -> None:
    assert rounded_down(5 * H) == 4 * H and rounded_down(50 * 60.0) == 3000.0 and rounded_down(60.0) == 600.0
    assert rounded_down(70 * 86400.0) == 70 * 86400.0
    assert resubmitted_limit(4 * H) == 8 * H and resubmitted_limit(3000.0) == 2 * H


def _killed_once(work: float, limit: float) -> Simulation:
    sim = Simulation([TraceJob("only", 8, 0.0, work)], gpu_cluster(1), PolicyConfig(), limits=UNDERESTIMATING)
    sim.jobs[1].sub = dataclasses.replace(sim.jobs[1].sub, time_limit_s=limit)
    return sim


def test_a_job_killed_at_its_limit_loses_the_run_and_comes_back_with_twice_the_limit() -> None:
    sim = _killed_once(work=5 * H, limit=4 * H)
    result = sim.run("kiln")
    job = result.jobs[0]
    killed_at = 4 * H + GRACE_S + 1.0  # plan()'s backstop: past the limit and the grace
    again = killed_at + RESUBMIT_DELAY_S
    assert job.kills == 1 and job.sub.time_limit_s == 8 * H and job.sub.submit == again
    assert math.isclose(job.finish or 0.0, again + 5 * H)  # the resubmission runs it all again, from nothing
    assert job.submitted_at == 0.0 and job.first_start == 0.0
    assert math.isclose(result.lost_gpu_s, 8 * killed_at)  # the killed run, every GPU-second of it
    assert math.isclose(result.busy_gpu_s, 8 * (killed_at + 5 * H))
    assert result.work_gpu_s == 8 * 5 * H  # the work counts once
    summary = summarize(result)
    assert summary["jobs_killed_at_limit"] == summary["kills_at_limit"] == 1 and summary["jobs_failed"] == 0
    assert math.isclose(summary["jct"]["mean_h"], round((again + 5 * H) / H, 3))
    assert summary["wait"]["mean_h"] == 0.0  # started at once both times: the user's delay is in the JCT only


def test_the_default_model_fails_a_job_past_its_limit_as_before() -> None:
    sim = Simulation([TraceJob("only", 8, 0.0, 5 * H)], gpu_cluster(1), PolicyConfig())
    sim.jobs[1].sub = dataclasses.replace(sim.jobs[1].sub, time_limit_s=4 * H)
    result = sim.run("kiln")
    assert result.jobs[0].failed and result.jobs[0].kills == 0 and result.work_gpu_s == 0.0


def test_a_replay_with_underestimates_kills_and_resubmits_and_finishes_every_job(tmp_path: Path) -> None:
    args = ["synthetic:200", "--hosts", "5", "--no-plots", "--policies", "easy,kiln", "--workers", "1"]
    assert main([*args, "--out", str(tmp_path / "over")]) == 0
    assert main([*args, "--out", str(tmp_path / "under"), "--limits", "underestimating"]) == 0
    over, under = (json.loads((tmp_path / d / "simulate.json").read_text()) for d in ("over", "under"))
    assert (over["limits"], under["limits"], under["underestimate_share"]) == (
        "overestimating",
        "underestimating",
        0.15,
    )
    for o, u in zip(over["sizes"][0]["results"], under["sizes"][0]["results"], strict=True):
        assert o["jobs_killed_at_limit"] == 0 and u["jobs_killed_at_limit"] > 0
        assert u["jobs_finished"] == u["jobs_total"] == 200 and u["jobs_failed"] == 0
        assert u["lost_gpu_h"] > o["lost_gpu_h"]  # the killed runs are lost work


def test_bad_limit_options_are_usage_errors() -> None:
    for argv in (["synthetic:10", "--limits", "exact"], ["synthetic:10", "--underestimate-share", "1.5"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_holdout_parts_are_the_halves_by_submission_and_other_sizes() -> None:
    trace = synthetic_trace(101)
    first, second = holdout.halves(trace)
    assert len(first) == 50 and len(second) == 51 and first[0].submit == second[0].submit == 0.0
    assert [j.id for j in first + second] == [j.id for j in sorted(trace, key=lambda j: j.submit)]
    parts = holdout.parts(trace)
    assert [(p.name, p.hosts) for p in parts] == [
        *[("first half", n) for n in holdout.TUNED_SIZES],
        *[("second half", n) for n in holdout.TUNED_SIZES],
        *[("whole trace", n) for n in holdout.OTHER_SIZES],
    ]
    assert not set(holdout.OTHER_SIZES) & set(holdout.TUNED_SIZES)


def test_holdout_replays_easy_and_kiln_on_each_part_and_reports_kiln_against_easy(tmp_path: Path) -> None:
    argv = ["synthetic:120", "--holdout", "--workers", "1", "--out", str(tmp_path), "--limits", "underestimating"]
    assert main(argv) == 0
    report = json.loads((tmp_path / "holdout.json").read_text())
    rows = report["holdout"]
    assert (
        len(rows) == len(holdout.TUNED_SIZES) * 2 + len(holdout.OTHER_SIZES) and report["limits"] == "underestimating"
    )
    for row in rows:
        easy = json.loads((tmp_path / f"holdout_{row['part'].replace(' ', '-')}_{row['hosts']}_easy.json").read_text())
        kiln = json.loads((tmp_path / f"holdout_{row['part'].replace(' ', '-')}_{row['hosts']}_kiln.json").read_text())
        assert row["easy_mean_jct_h"] == easy["jct"]["mean_h"] and row["kiln_mean_jct_h"] == kiln["jct"]["mean_h"]
        assert math.isclose(row["jct_cut_vs_easy"], 1 - kiln["jct"]["mean_h"] / easy["jct"]["mean_h"], abs_tol=1e-4)
        assert row["jobs"] == (120 if row["part"] == "whole trace" else 60)
