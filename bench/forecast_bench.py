"""Start-time forecasts on the Philly replay, estimated at submission, against the actual start (issue 41,
acceptance 3): kiln's projection (``plan()`` run forward from the snapshot, running jobs ending as kiln expects,
what ``kiln why`` shows first) beside Slurm's method (the same plan with every job running to its time limit, as
``squeue --start`` assumes), under both limit models of the replay (``--limits``: users' limits never below the run
time, or 15% of them below it, killed and resubmitted). The method and its bounds: ``scheduler/simulate/forecasts.py``.

    .venv/bin/python bench/forecast_bench.py                 # bench/results/forecast_bench.json
    .venv/bin/python bench/forecast_bench.py --smoke         # synthetic, small: tests/e2e/test_forecast_bench_smoke.py

Each (limit model, policy) replays in its own process; a forecast costs two projections of up to 64 ``plan()``
calls, so ``--every N`` forecasts every N-th submission (the replay itself is whole either way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.simulate.forecasts import ForecastRecorder, summary  # noqa: E402
from scheduler.simulate.limits import MODELS, model  # noqa: E402
from scheduler.simulate.projection import HORIZON_S, MAX_EVENTS  # noqa: E402
from scheduler.simulate.replay import policies  # noqa: E402
from scheduler.simulate.report import summarize  # noqa: E402
from scheduler.simulate.simulation import Simulation  # noqa: E402
from scheduler.simulate.synthetic import gpu_cluster  # noqa: E402
from scheduler.simulate.trace import load_trace, offered_load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT.parent / "shared" / "traces" / "philly-multigpu-jobs.json")


class _Logged(ForecastRecorder):
    """Says how far a long run is, every 100 forecasts (a full-trace run takes tens of CPU-minutes)."""

    label = ""

    def started(self, job_id: int, now: float) -> None:
        before = len(self.done)
        super().started(job_id, now)
        if len(self.done) != before and len(self.done) % 100 == 0:
            print(f"{self.label}: {len(self.done)} forecasts settled, day {now / 86400:.1f}", flush=True)


def run_one(
    trace_path: str, jobs: int | None, hosts: int, policy: str, limits: str, every: int, progress: bool
) -> dict:
    trace = load_trace(trace_path, jobs)
    config, _oracle = policies()[policy]
    recorder = _Logged(config, every=every, progress=progress)
    recorder.label = f"{limits} {policy}"
    sim = Simulation(trace, gpu_cluster(hosts), config, limits=model(limits), observer=recorder)
    started = time.perf_counter()
    result = sim.run(policy)
    replay = summarize(result)
    return {
        "limits": limits,
        "policy": policy,
        "hosts": hosts,
        "offered_load": round(offered_load(trace, hosts * 8), 3),
        "replay": {k: replay[k] for k in ("jct", "wait", "jobs_finished", "jobs_killed_at_limit", "lost_gpu_h")},
        "forecasts": summary(recorder.done),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def table(runs: list[dict]) -> str:
    """One row per (limit model, policy): each method's median / p90 absolute error over the forecasts it gave, how
    often it gave one, the methods side by side where every one did, and how often the start fell in kiln's range."""
    progress = any("kiln+progress" in r["forecasts"]["all"] for r in runs)
    head = (
        "| limits | policy | forecasts (waited) | kiln median / p90 abs. error h | Slurm median / p90 h | "
        "given: kiln / Slurm | every method gave one: kiln / Slurm median h | actual within kiln's range |"
        + (" kiln+progress median / p90 h (bound) |" if progress else "")
    )
    lines = [head, "|" + "---|" * (9 if progress else 8)]
    for r in runs:
        f = r["forecasts"]
        k, s = f["all"]["kiln"], f["all"]["slurm"]
        both = f["where_every_method_gave_one"]
        row = (
            f"| {r['limits']} | {r['policy']} | {f['settled']} ({f['waited']}) | {k['median_abs_h']:.1f} / "
            f"{k['p90_abs_h']:.1f} | {s['median_abs_h']:.1f} / {s['p90_abs_h']:.1f} | {k['given']:.0%} / "
            f"{s['given']:.0%} | {both['kiln']['median_abs_h']:.1f} / {both['slurm']['median_abs_h']:.1f} | "
            f"{f['in_kiln_range']:.0%} |"
        )
        if progress:
            p = f["all"]["kiln+progress"]
            row += f" {p['median_abs_h']:.1f} / {p['p90_abs_h']:.1f} |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--jobs", type=int, default=None, help="replay only the first N jobs")
    ap.add_argument("--hosts", type=int, default=48)
    ap.add_argument("--policies", default="kiln,easy")
    ap.add_argument("--limits", default=",".join(MODELS), help="limit models, comma-separated")
    ap.add_argument("--every", type=int, default=1, help="forecast every N-th submission")
    ap.add_argument("--progress", action="store_true", help="also the kiln+progress bound (true remaining times)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--smoke", action="store_true", help="synthetic:150 on 4 hosts: that it runs, for CI")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "forecast_bench.json"))
    args = ap.parse_args(argv)
    if args.smoke:
        args.trace, args.jobs, args.hosts, args.every = "synthetic:150", None, 4, 1
    tasks = [
        (args.trace, args.jobs, args.hosts, p, lim, args.every, args.progress)
        for lim in args.limits.split(",")
        for p in args.policies.split(",")
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(tasks)))) as pool:
        runs = list(pool.map(run_one, *zip(*tasks, strict=True)))
    report: dict[str, Any] = {
        "trace": args.trace,
        "jobs": args.jobs,
        "hosts": args.hosts,
        "every": args.every,
        "smoke": args.smoke,
        "bounds": {"max_events": MAX_EVENTS, "horizon_s": HORIZON_S, "cpu_budget_s": None},
        "wall_s": round(time.perf_counter() - started, 1),
        "runs": runs,
    }
    report["table"] = table(runs)
    print(report["table"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
