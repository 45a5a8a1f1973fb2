"""Trace replay in simulated time, through the very same ``plan()`` as the live loop, against the baselines.

``python -m scheduler.simulate TRACE [--hosts N[,M...]] [--gpus-per-host 8] [--period 3600] [--jobs N] [--out DIR]``
(``TRACE`` = a Philly-format JSON file, or ``synthetic:N`` for a generated one.) Every policy and baseline replays
the same trace on the same cluster under the same model, each size and policy in its own process.

Model (stated, so the figures can be judged):

* **work** = the trace's ``runtime`` (first attempt's start to last attempt's end). The trace's failed attempts
  are inside it and are not replayed (not on top of it, not as separate failures): a job runs its runtime once,
  unless preempted. So the live loop's restart backoff and ``max_restarts``, which apply to failures, never
  trigger; a preemption is not a restart there either (requeued with its progress, no backoff, not counted).
* **a preemption costs** what it costs in kiln: the job keeps its GPUs ``STOP_S`` (60 s) to checkpoint on SIGTERM
  and exit; it keeps only the progress of its last periodic checkpoint (every ``CHECKPOINT_S`` = 30 min of
  training; conservatively, as if the SIGTERM checkpoint were lost); on restart it holds its GPUs ``RESTORE_S`` +
  ``WARM_COMPILE_S`` (120 + 60 s) before it trains again. All of that is GPU time lost (``lost_gpu_h``).
* **time limits** are enforced as ``plan()`` enforces them live (every attempt's run counted, after a minute of
  grace): a job preempted often enough to run past its limit fails (``jobs_failed``); its GPU time counts as lost,
  its work as not done (not in ``util_makespan``) and its JCT is left out of the mean (the table's JCT is over the
  jobs that finished).
* **what the policy knows** (``Submission`` and the observed state only; no job view carries the trace's
  runtime): the user's time limit, modelled as users give them (``scheduler.simulate.limits``, ``--limits``): none
  for 40% of jobs; otherwise the run time times a log-normal overestimate (median 3x, sigma 0.8, at least 1.1x),
  rounded up to 1, 2, 4, 8, 12 h, 1, 2, 3, 5, 7, 14, 30 or 60 days (seeded per job id); with ``--limits
  underestimating`` a share of the limits (15%) is below the run time instead: such a job is killed at its limit,
  its run lost, and resubmitted by its user 30 minutes later with twice the limit, as a new job (its JCT counts
  from the first submission, its waits all count, its killed runs are ``lost_gpu_h``); the job's attained service
  (seconds its earlier attempts ran); the team's finished jobs (their run times and the share of their limits they
  used).
  The one exception is the ``sjf-oracle`` baseline, given each job's true runtime as its limit: a bound, not a
  policy one can run.
* each trace job gets a team and a QoS class from SHA-256 of its id: byte 0 picks the class (15% gold, 30% silver,
  30% bronze, 25% best-effort), byte 1 the team (``team0``..``team5``); max queue wait gold 30 min, silver 2 h,
  bronze 8 h, best-effort none. **Wait** = all time queued (the first wait and every requeue after a
  preemption); a job meets its queue-wait SLA when all of its waits add up to at most its max wait, and the
  policy is told the budget left.
* team quotas (kiln and the priority baseline): each team's nominal is an even share of the GPUs, one cohort, all
  lendable, borrowing unlimited: an idle team's share is lent and reclaimed when that team needs it.
* a cycle runs on every arrival, end and stop, when a waiting job reaches 50%, 90% and 100% of its max wait (or
  its aging age), and every ``--period`` seconds while jobs wait (the live loop's timer).
* utilisation: ``util_makespan`` = useful GPU time (the trace's work, the same for every policy) over each
  policy's own makespan; ``busy_window`` = GPU time held (useful or lost) over the submission window.

``--holdout`` replays EASY and kiln on the parts of the trace the defaults were not tuned on
(``scheduler.simulate.holdout``).

Policies: ``fifo`` (strict, the head blocks); ``easy`` (EASY backfill: FIFO, the head reserves, later jobs
backfill on their time limits; jobs without one do not backfill into a reservation); ``priority`` (Slurm
multifactor / Kueue ClusterQueue: QoS class, fair share, age; backfill; lower classes preempted at once, quotas
with reclaim); ``kiln`` (the live loop's policy, from the ``KILN_POLICY__*`` settings); ``sjf-oracle`` (shortest
true runtime first, with backfill on true runtimes: the ORACLE BOUND).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

from core.policy_config import PolicyConfig
from core.settings import get_settings
from scheduler.simulate import holdout
from scheduler.simulate.jobs import Result
from scheduler.simulate.limits import LIMIT_SEED, MODELS, OVERESTIMATING, LimitModel
from scheduler.simulate.limits import model as limit_model
from scheduler.simulate.report import acceptance, across_draws, plot, summarize, table
from scheduler.simulate.simulation import CYCLE_S, Simulation
from scheduler.simulate.synthetic import gpu_cluster
from scheduler.simulate.trace import TraceJob, load_trace, offered_load

ORACLE = "sjf-oracle"


def policies() -> dict[str, tuple[PolicyConfig, bool]]:
    """Every policy replayed: name -> (config, given the true runtimes?)."""
    plain = PolicyConfig(ordering="fifo", backfill=False, enforce_quotas=False, preemption=False)
    head_only = plain.model_copy(update={"backfill": True, "max_reservations": 1, "reserve_per_class": False})
    return {
        "fifo": (plain, False),
        "easy": (head_only, False),
        "priority": (
            PolicyConfig(
                ordering="priority",
                sla_urgency=False,
                starvation_age_s=None,
                preempt_patience_s=None,
                preempt_only_at_risk=False,
                max_preemptions_per_job=None,
                service_classes=False,
            ),
            False,
        ),
        "kiln": (get_settings().policy, False),  # the live loop's policy, from the same KILN_POLICY__* settings
        ORACLE: (head_only.model_copy(update={"ordering": "sjf"}), True),
    }


def replay_one(
    trace: Sequence[TraceJob],
    hosts: int,
    gpus_per_host: int,
    name: str,
    tick: float,
    period: float,
    limit_seed: int = LIMIT_SEED,
    limits: LimitModel = OVERESTIMATING,
) -> Result:
    config, oracle = policies()[name]
    sim = Simulation(
        trace,
        gpu_cluster(hosts, gpus_per_host),
        config,
        tick=tick,
        period=period,
        oracle=oracle,
        limit_seed=limit_seed,
        limits=limits,
    )
    return sim.run(name)


K = TypeVar("K")


def replay_all(argsets: dict[K, tuple[Any, ...]], workers: int, finished: Callable[[K, Result], None]) -> None:
    """``replay_one(*args)`` for each entry, each in its own process (at most ``workers``), ``finished`` called as
    each is done (a long run can be read, or resumed by hand, part-way)."""
    if workers <= 1 or len(argsets) == 1:
        for key, a in argsets.items():
            finished(key, replay_one(*a))
        return
    with ProcessPoolExecutor(max_workers=min(len(argsets), workers)) as pool:
        futures = {pool.submit(replay_one, *a): key for key, a in argsets.items()}
        for future in as_completed(futures):
            finished(futures[future], future.result())


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,M,...: {text!r}") from None


def _hosts(text: str) -> list[int]:
    sizes = _ints(text)
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"host counts must be >= 1: {text!r}")
    return sizes


def _seeds(text: str) -> list[int]:
    seeds = _ints(text)
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed given twice: {text!r}")
    return seeds


def _policy_names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in policies()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown policy {unknown or text!r}; choose from {', '.join(policies())}")
    return names


def _draw(
    trace: Sequence[TraceJob],
    seed: int,
    sizes: list[int],
    names: list[str],
    gpus_per_host: int,
    summarized: dict[tuple[int, int, str], dict[str, Any]],
) -> dict[str, Any]:
    """One draw's tables (one per size) and acceptance, printed and returned for the report."""
    entries = []
    for n in sizes:
        summaries = [summarized[(seed, n, p)] for p in names]
        load = offered_load(trace, n * gpus_per_host)
        entry: dict[str, Any] = {
            "hosts": n,
            "gpus": n * gpus_per_host,
            "offered_load": round(load, 3),
            "results": summaries,
        }
        if "kiln" in names and len(names) > 1 and any(p != "kiln" and p != ORACLE for p in names):
            entry["acceptance"] = acceptance(summaries)
        entries.append(entry)
        print(
            f"\n{n} hosts x {gpus_per_host} GPUs ({n * gpus_per_host} GPUs, offered load {load:.2f}), limit seed {seed}"
        )
        print(table(summaries))
        if "acceptance" in entry:
            print("acceptance:", json.dumps(entry["acceptance"]))
    return {"limit_seed": seed, "sizes": entries}


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1: {text!r}")
    return share


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kiln simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="Philly-format JSON, or synthetic:N")
    ap.add_argument(
        "--hosts",
        type=_hosts,
        default=[40],
        help="hosts (default 40); a list (40,48,52) replays each size: one table per size",
    )
    ap.add_argument("--gpus-per-host", type=int, default=8)
    ap.add_argument(
        "--policies",
        type=_policy_names,
        default=list(policies()),
        help=f"comma-separated subset of {', '.join(policies())} (default: all)",
    )
    ap.add_argument(
        "--tick",
        type=float,
        default=0.0,
        help="0: a cycle on every event (default); else cycles rounded up to multiples of this (s)",
    )
    ap.add_argument("--period", type=float, default=CYCLE_S, help="a cycle at least this often while jobs wait (s)")
    ap.add_argument("--jobs", type=int, default=None, help="replay only the first N jobs")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes replaying in parallel")
    ap.add_argument("--out", default="simulate-out")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--limit-seed",
        type=_seeds,
        default=[LIMIT_SEED],
        help=f"draw the users' time limits with another seed (default {LIMIT_SEED}); a list (16,7,3) replays each "
        "draw and reports on which the targets hold (a policy tuned to one draw shows it)",
    )
    ap.add_argument(
        "--limits",
        choices=list(MODELS),
        default=OVERESTIMATING.name,
        help="the users' time limits: overestimating (default: never below 1.1x the run time) or "
        "underestimating (a share of them below it: killed at the limit, resubmitted with twice it)",
    )
    ap.add_argument(
        "--underestimate-share",
        type=_share,
        default=None,
        help="with --limits underestimating: the share of the jobs with a limit that get one below their "
        "run time (default 0.15)",
    )
    ap.add_argument(
        "--holdout",
        action="store_true",
        help="replay EASY and kiln on the parts of the trace the defaults were not tuned on: each half by "
        "submission time at 40, 48 and 52 hosts, and the whole trace at 36, 44, 56 and 64 (instead of --hosts and "
        "--policies)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limits = limit_model(args.limits, args.underestimate_share)
    trace = load_trace(args.trace, args.jobs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.holdout:
        return _holdout(trace, args, limits, out)
    started = time.perf_counter()
    sizes: list[int] = args.hosts
    names: list[str] = args.policies
    seeds: list[int] = args.limit_seed
    # policy by policy, so the first finish first
    tasks = [(seed, n, p) for seed in seeds for p in names for n in sizes]
    argsets = [(trace, n, args.gpus_per_host, p, args.tick, args.period, seed, limits) for seed, n, p in tasks]
    done: dict[tuple[int, int, str], Result] = {}
    summarized: dict[tuple[int, int, str], dict[str, Any]] = {}

    def finished(task: tuple[int, int, str], result: Result) -> None:
        done[task] = result
        summarized[task] = summarize(result)
        seed, n, p = task
        name = f"replay_{n}_{p}.json" if len(seeds) == 1 else f"replay_{n}_{p}_seed{seed}.json"
        (out / name).write_text(json.dumps(summarized[task], indent=2) + "\n")
        print(f"done: {n} hosts, {p}" + (f", limit seed {seed}" if len(seeds) > 1 else ""), flush=True)

    replay_all(dict(zip(tasks, argsets, strict=True)), args.workers, finished)
    wall_s = round(time.perf_counter() - started, 1)
    print(f"{len(trace)} jobs; {len(tasks)} replays took {wall_s} s")
    draws = [_draw(trace, seed, sizes, names, args.gpus_per_host, summarized) for seed in seeds]
    report = _report(args, limits, len(trace), wall_s) | {"sizes": draws[0]["sizes"]}
    if len(seeds) > 1:
        report["draws"] = draws
        report["across_draws"] = across_draws(draws)
        if report["across_draws"]:
            print("\nacross draws:", json.dumps(report["across_draws"]))
    plots: list[str] = []
    if not args.no_plots:
        plots = plot([done[(seeds[0], sizes[0], p)] for p in names], out)
        for p in plots:
            print("plot:", p)
    report["plots"] = plots
    (out / "simulate.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _report(args: argparse.Namespace, limits: LimitModel, jobs: int, wall_s: float) -> dict[str, Any]:
    policy = get_settings().policy  # the live loop's policy (each replay process reads the same settings)
    return {
        "trace": args.trace,
        "jobs": jobs,
        "gpus_per_host": args.gpus_per_host,
        "tick_s": args.tick,
        "period_s": args.period,
        "limit_seed": args.limit_seed[0],
        "limits": limits.name,
        "underestimate_share": limits.underestimate_share,
        "wall_s": wall_s,
        "policy": policy.model_dump(),
    }


def _holdout(trace: list[TraceJob], args: argparse.Namespace, limits: LimitModel, out: Path) -> int:
    """``--holdout``: EASY and kiln on each held-out part (``holdout.parts``), one table of kiln against EASY."""
    started = time.perf_counter()
    seed = args.limit_seed[0]
    held = holdout.parts(trace)
    argsets = {
        (i, p): (list(part.jobs), part.hosts, args.gpus_per_host, p, args.tick, args.period, seed, limits)
        for p in holdout.POLICIES
        for i, part in enumerate(held)
    }
    summarized: dict[tuple[int, str], dict[str, Any]] = {}

    def finished(task: tuple[int, str], result: Result) -> None:
        summarized[task] = summarize(result)
        i, p = task
        (out / f"holdout_{held[i].key}_{p}.json").write_text(json.dumps(summarized[task], indent=2) + "\n")
        print(f"done: {held[i].name}, {held[i].hosts} hosts, {p}", flush=True)

    replay_all(argsets, args.workers, finished)
    wall_s = round(time.perf_counter() - started, 1)
    rows = [
        holdout.compare(
            part,
            offered_load(part.jobs, part.hosts * args.gpus_per_host),
            summarized[(i, "easy")],
            summarized[(i, "kiln")],
        )
        for i, part in enumerate(held)
    ]
    print(f"\nheld out ({limits.name} limits, seed {seed}; {len(argsets)} replays took {wall_s} s)")
    print(holdout.table(rows))
    report = _report(args, limits, len(trace), wall_s) | {"holdout": rows}
    (out / "holdout.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
