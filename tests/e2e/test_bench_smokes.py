"""The benches in their smoke modes, so none rots on main: ``bench/sandbox_bench.py --smoke`` (the shipped tiny
example through two ``kiln up``s, the sandbox off and on), ``bench/sandbox_gpu_probe.py --smoke`` (the worker's
sandbox called directly) and ``bench/archive_check_bench.py --smoke`` (hostile archives against the check, the old
one beside it). Their figures are the GPU host's or an idle box's; here only that they run and what they say holds:
the sandboxed job ran in its sandbox, as another uid, and trained to the same loss; the check refused in bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_") and k != "OUT"}
    done = subprocess.run(
        [sys.executable, *args, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_sandbox_bench_runs_the_example_with_the_sandbox_off_and_on(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/sandbox_bench.py", "--smoke", "--example", "tiny")["examples"]["tiny"]
    assert got["runs"]["sandboxed"]["sandboxed_in_log"] and not got["runs"]["baseline"]["sandboxed_in_log"]
    assert got["sandboxed_vs_baseline"]["same_final_loss"]
    assert got["runs"]["sandboxed"]["launch_to_first_step_s"] > got["runs"]["sandboxed"]["launch_to_process_s"] > 0


def test_the_gpu_probe_runs_the_snippet_in_the_workers_sandbox(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/sandbox_gpu_probe.py", "--smoke")
    assert got["outside"]["returncode"] == 0 and got["sandboxed"]["returncode"] == 0, got
    assert got["sandboxed"]["finite"] and got["sandboxed"]["dev_nvidia"] == []
    if os.geteuid() == 0:
        assert got["sandboxed"]["uid"] != 0


def test_the_archive_check_bench_runs_and_the_check_stays_in_bounds() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    done = subprocess.run(
        [sys.executable, "bench/archive_check_bench.py", "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["worst_new_rss_growth_mb"] <= 50, summary


def test_the_young_daly_bench_finds_the_advised_interval_near_the_best(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/young_daly_bench.py", "--smoke")
    (case,) = got["cases"]
    assert got["smoke"] and case["within_10pct"], case
    assert case["quarter_advised_vs_best"] > 1.1 and case["four_times_advised_vs_best"] > 1.1  # the check can fail


def test_the_compile_cache_bench_finds_the_team_entry_on_another_host_and_in_a_sweep(tmp_path: Path) -> None:
    """Issue 40's bench: job A compiles cold on kiln up's worker; job B on a second worker (another name and job
    directory, the storage shared) starts from the team's entry; a sweep of a new shape misses once, then hits."""
    got = bench(tmp_path, "bench/compile_cache_bench.py", "--smoke", "--sweep-jobs", "2")
    assert (got["cold"]["cache_hit"], got["cold"]["cache_source"]) == (False, None)
    b = got["second_host"]
    assert (b["cache_hit"], b["cache_source"], b["cache_key"]) == (True, "team", got["cold"]["cache_key"])
    assert b["placement"] and "host2" in json.dumps(b["placement"])
    sweep = got["sweep"]
    assert [j["cache_hit"] for j in sweep["jobs"]] == [False, True], sweep["jobs"]
    assert set(sweep["states"].values()) == {"SUCCEEDED"}


# The benches whose smoke mode no test ran (issue 42, build 4): the GPU figures are the lent host's; here that each
# runs on the CPU end to end and says what it measured.


def test_the_step_profile_profiles_the_bare_and_kiln_steps(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/step_profile.py", "--spec", "examples/gpt-tiny.yaml", "--smoke")
    assert all(got[side]["steps"] > 0 and got[side]["wall_ms_per_step"] > 0 for side in ("bare", "kiln")), got


def test_the_trainer_bench_measures_kiln_against_the_bare_loop(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/trainer_bench.py", "--smoke")
    assert got["smoke"] and {"bare", "kiln", "kiln_ckpt10"} <= set(got["variants"]), list(got["variants"])
    assert got["summary"]["bare_tokens_per_s"] > 0 and got["summary"]["ratio_kiln_vs_bare"] > 0, got["summary"]


def test_the_user_code_bench_runs_bare_kiln_and_the_worker(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/usercode_bench.py", "--smoke")
    assert set(got["rows"]) == {"bare", "kiln", "worker"} and got["kiln_over_bare"] > 0 and got["worker_over_bare"] > 0


def test_the_scaling_bench_runs_one_and_two_processes_and_the_allreduce(tmp_path: Path) -> None:
    got = bench(tmp_path, "bench/scaling_bench.py", "--smoke")
    assert {"kiln_1", "kiln_ddp", "kiln_fsdp"} <= set(got["variants"]), list(got["variants"])
    assert all(v["steps"] > 0 and v["final_loss"] > 0 for v in got["variants"].values()), got["variants"]
    assert got["allreduce"] and all(r["seconds"] > 0 for r in got["allreduce"])
