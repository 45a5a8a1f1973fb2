"""The simulator on small synthetic traces: every policy through plan() end to end, under one stated model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from core.policy_config import PolicyConfig
from scheduler.simulate.limits import LIMIT_LADDER_H, user_time_limit
from scheduler.simulate.replay import ORACLE, main
from scheduler.simulate.simulation import CHECKPOINT_S, RESTART_S, STOP_S, Simulation
from scheduler.simulate.synthetic import gpu_cluster
from scheduler.simulate.trace import TraceJob, qos_and_team, synthetic_trace

H = 3600.0


def test_qos_and_team_are_a_stable_hash() -> None:
    assert qos_and_team("application_1506638472019_14199") == qos_and_team("application_1506638472019_14199")
    classes = [qos_and_team(j.id)[0] for j in synthetic_trace(400)]
    assert {"gold", "silver", "bronze", "best-effort"} == set(classes)


def test_users_time_limits_are_absent_or_too_long_and_round() -> None:
    limits = [(w, user_time_limit(f"job{i}", w)) for i, w in enumerate([600.0, 3 * H, 20 * H, 200 * H] * 250)]
    given = [(w, lim) for w, lim in limits if lim is not None]
    assert 0.3 < 1 - len(given) / len(limits) < 0.5  # about 40% give none
    assert all(lim >= 1.1 * w for w, lim in given)  # a limit below the run time would have killed the job
    ratios = sorted(lim / w for w, lim in given)
    assert 2.5 < ratios[len(ratios) // 2] <= 8  # several times too long (rounded up)
    rungs = {h * H for h in LIMIT_LADDER_H}
    assert all(lim in rungs or lim % 86400 == 0 for _, lim in given)
    assert user_time_limit("job7", 3 * H) == user_time_limit("job7", 3 * H)  # seeded


def test_all_policies_replay_the_same_work_and_the_oracle_is_marked(tmp_path: Path) -> None:
    assert main(["synthetic:250", "--hosts", "6", "--out", str(tmp_path), "--workers", "1"]) == 0
    report = json.loads((tmp_path / "simulate.json").read_text())
    (size,) = report["sizes"]
    by_name = {r["policy"]: r for r in size["results"]}
    assert set(by_name) == {"fifo", "easy", "priority", "kiln", ORACLE}
    assert [n for n, r in by_name.items() if r["oracle"]] == [ORACLE]
    for r in by_name.values():
        assert r["jobs_finished"] == r["jobs_total"] == 250 and r["jobs_failed"] == 0
        assert 0 < r["util_makespan"] <= 1
        for cls in r["sla_attainment"].values():  # every job that broke its max wait says what it waited with
            assert sum(cls["missed_by_reason"].values()) == round(cls["jobs"] * (1 - cls["attainment"]))
    for name in ("fifo", "easy", ORACLE):
        assert by_name[name]["preemptions"] == 0 and by_name[name]["lost_gpu_h"] == 0
    assert by_name["easy"]["jct"]["mean_h"] <= by_name["fifo"]["jct"]["mean_h"]
    assert set(size["acceptance"]) >= {"gold_sla_ok", "jct_ok", "util_ok", "preemptions_ok", "lost_gpu_h"}
    assert (tmp_path / "simulate_queue.png").stat().st_size > 1000


def test_replays_are_deterministic_and_sizes_are_reported_each(tmp_path: Path) -> None:
    args = ["synthetic:150", "--hosts", "6,4", "--no-plots", "--policies", "fifo,kiln", "--workers", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "simulate.json").read_text())
    b = json.loads((tmp_path / "b" / "simulate.json").read_text())

    def stable(report: dict[str, object]) -> object:
        return [
            [{k: v for k, v in r.items() if not k.startswith("plan_ms")} for r in s["results"]] for s in report["sizes"]
        ]  # type: ignore[attr-defined]

    assert stable(a) == stable(b)
    six, four = a["sizes"]
    assert (six["hosts"], four["hosts"]) == (6, 4)
    assert abs(four["offered_load"] - six["offered_load"] * 6 / 4) < 2e-3  # the same work on fewer GPUs


def test_another_limit_seed_draws_other_user_limits_and_the_report_says_which(tmp_path: Path) -> None:
    """A policy tuned on one draw of the users' limits is checked on others (docs/scheduler-experiments.md, the
    makespan guard)."""
    assert user_time_limit("job3", 20 * H, 7) != user_time_limit("job3", 20 * H)  # this job's limit differs
    args = ["synthetic:120", "--hosts", "4", "--no-plots", "--policies", "easy", "--workers", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--limit-seed", "7"]) == 0
    a, b = (json.loads((tmp_path / d / "simulate.json").read_text()) for d in ("a", "b"))
    assert (a["limit_seed"], b["limit_seed"]) == (16, 7)
    assert a["sizes"][0]["results"][0]["jct"] != b["sizes"][0]["results"][0]["jct"]  # EASY backfills on the limits


def _one_job_sim(work: float) -> Simulation:
    return Simulation([TraceJob("only", 8, 0.0, work)], gpu_cluster(1), PolicyConfig())


def test_a_job_alone_runs_its_trace_runtime_once() -> None:
    sim = _one_job_sim(5 * H)
    result = sim.run("kiln")
    job = result.jobs[0]
    assert job.finish == 5 * H and job.queued_s == 0.0 and job.attempt == 1
    assert result.busy_gpu_s == result.work_gpu_s == 8 * 5 * H and result.lost_gpu_s == 0.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["fifo", "easy", "kiln"])
def test_a_replay_ends_when_what_still_waits_can_never_start(policy: str) -> None:
    """A job larger than the cluster waits for ever; once nothing else runs, arrives or wakes, the replay ends
    (``kiln simulate synthetic:50 --hosts 2,1`` in docs/cli.md ran its hourly cycle for ever)."""
    sim = Simulation(
        [TraceJob("fits", 8, 0.0, 2 * H), TraceJob("too-big", 16, 60.0, H)], gpu_cluster(1), PolicyConfig()
    )
    result = sim.run(policy)
    by_gpus = {j.sub.gpus: j for j in result.jobs}
    assert by_gpus[8].finish == 2 * H and by_gpus[16].finish is None


def test_a_preemption_costs_the_stop_the_restart_and_the_steps_since_the_checkpoint() -> None:
    sim = _one_job_sim(5 * H)
    sim._enqueue(1, 0.0)
    sim._start(1, (), 0.0, None)
    asked = 2 * CHECKPOINT_S + 600.0  # 10 minutes after its second checkpoint
    sim._preempt(1, asked, reclaim=False)
    sim._event(asked + STOP_S, 1, "stopped", 1)
    job = sim.jobs[1]
    assert job.progress == 2 * CHECKPOINT_S and job.preemptions == 1 and job.attained_s == asked + STOP_S
    assert sim.lost_gpu_s == 8 * (600.0 + STOP_S)
    sim._start(1, (), asked + STOP_S + 100.0, None)
    end = next(t for t, _s, _j, kind, _a in sim.events if kind == "end" and _a == 2)
    assert end == asked + STOP_S + 100.0 + RESTART_S + 5 * H - 2 * CHECKPOINT_S
    sim._event(end, 1, "end", 2)
    assert math.isclose(sim.lost_gpu_s, 8 * (600.0 + STOP_S + RESTART_S))
    assert job.queued_s == 100.0  # the requeue's wait counts


def test_bad_host_list_or_policy_is_a_usage_error() -> None:
    for argv in (["synthetic:10", "--hosts", "8,x"], ["synthetic:10", "--policies", "fifo,magic"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_several_limit_seeds_replay_each_draw_and_say_on_which_the_targets_hold(tmp_path: Path) -> None:
    args = ["synthetic:120", "--hosts", "4", "--no-plots", "--policies", "easy,kiln", "--workers", "1"]
    assert main([*args, "--out", str(tmp_path), "--limit-seed", "16,7"]) == 0
    report = json.loads((tmp_path / "simulate.json").read_text())
    one = json.loads((tmp_path / "replay_4_kiln_seed7.json").read_text())
    assert [d["limit_seed"] for d in report["draws"]] == [16, 7] and report["sizes"] == report["draws"][0]["sizes"]
    assert one == report["draws"][1]["sizes"][0]["results"][1]
    across = report["across_draws"]
    assert across["seeds"] == [16, 7] and set(across["every_target_met_on"]) <= {16, 7}
    (size,) = across["sizes"]
    assert set(size["by_seed"]) == {"16", "7"} and set(size["met_on"]) == set(across["every_target_met_on"])
    for seed, draw in zip((16, 7), report["draws"], strict=True):
        assert (
            size["by_seed"][str(seed)]["jct_cut_vs_best_baseline"]
            == draw["sizes"][0]["acceptance"]["jct_cut_vs_best_baseline"]
        )


def test_a_seed_given_twice_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["synthetic:10", "--limit-seed", "7,7"])
    assert exit_.value.code == 2 and "a seed given twice" in capsys.readouterr().err
