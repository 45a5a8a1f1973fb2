"""Chaos benchmark: a whole kiln under a timeline of faults, then every job checked against its checkpoints.

A PostgreSQL and a Redis of its own (free ports; the shared 5432/6379 never see a fault), the API (uvicorn), two
schedulers (one leads), two workers as two hosts with 3 CPU slots each, the tiny GPT on CPU. First the fault-free
twins (one per seed, nothing else running), then the jobs (``--jobs``, through the API: one during the first fault,
the rest in three batches) under 12 faults: the leading scheduler frozen (SIGSTOP) past its lease while a job is
submitted, a worker frozen past its lease while its trainers train on, a trainer SIGKILLed, the leading scheduler
SIGKILLed, the API SIGKILLed, a job's checkpoint directory read-only for 20 s across its last step, a worker
SIGKILLed and kept away past its lease (its trainers told by the lifeline), Redis SIGKILLed, PostgreSQL stopped
with ``pg_ctl stop -m immediate``, PostgreSQL away for 14 s while the leader dies (a standby leads when it is back),
a whole host (worker and trainers) SIGKILLed, a whole node frozen and thawed worker first. A killed process comes
back as its supervisor would bring it back; no job is ever touched by hand.

Afterwards, from the database and the checkpoints on disk (``harness/chaos.py``): every job SUCCEEDED; no
checkpoint committed by an attempt after it was declared LOST (manifests, checkpoint rows, telemetry); each job's
recorded step, loss and checkpoint list are what its last checkpoint holds (which verifies); each final loss equals
its twin's; no attempt declared LOST for silence inside a database outage; the job submitted while the leader was
frozen admitted by a standby within the leader's lease + 2 s, the old leader stepping down. The ratio against the
baseline: each job's wall time against its fault-free twin's.

    .venv/bin/python bench/chaos_bench.py [--jobs 30] [--steps 160] [--lease 6] [--leader-lease 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import select  # noqa: E402

from core.models import Attempt, Event, Job  # noqa: E402
from core.states import JobState  # noqa: E402
from harness.chaos import (  # noqa: E402
    Chaos,
    chaos_cluster,
    chaos_spec,
    check_invariants,
    job_summaries,
    timeline_verdicts,
)
from trainer.checkpoint.store import verify  # noqa: E402


def wall_s(chaos: Chaos, job_id: int) -> float | None:
    with chaos.c.sessionmaker()() as db:
        job = db.get(Job, job_id)
        first = db.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)).first()
        end = db.scalars(select(Event).where(Event.job_id == job_id, Event.type == JobState.SUCCEEDED)).first()
    if job is None or first is None or first.started_at is None or end is None:
        return None
    return (end.created_at - first.started_at).total_seconds()


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kiln-chaos-"))
    lease = args.lease
    seeds = list(range(1, args.seeds + 1))
    out: dict[str, Any] = {
        "config": {
            "jobs": args.jobs,
            "seeds": seeds,
            "steps": args.steps,
            "every_steps": args.every,
            "lease_s": lease,
            "heartbeat_s": 1.0,
            "scheduler_interval_s": 1.0,
            "workers": 2,
            "slots_per_worker": 3,
            "schedulers": 2,
            "step_sleep_s": args.step_sleep,
            "leader_lease_s": args.leader_lease,
            "final_checkpoint_retry_s": args.final_retry,
        },
        "load_average_start": os.getloadavg(),
    }
    started = time.monotonic()
    timings = {"leader_lease_s": args.leader_lease, "final_checkpoint_retry_s": args.final_retry}
    with chaos_cluster(tmp, lease_s=lease, worker_slots=3, step_sleep_s=args.step_sleep, **timings) as chaos:
        spec = lambda name, seed: chaos_spec(name, seed=seed, steps=args.steps, every_steps=args.every)  # noqa: E731

        # The baseline: one fault-free twin per seed, alone on the cluster.
        twins = {seed: chaos.submit(spec(f"twin-{seed}", seed)) for seed in seeds}
        chaos.wait_final(list(twins.values()), 600)
        twin_wall = {seed: wall_s(chaos, j) for seed, j in twins.items()}
        chaos.t0 = time.monotonic()  # the timeline counts from the first chaos job

        jobs: list[int] = []
        seed_of: dict[int, int] = {}

        def submit_one() -> int:
            seed = seeds[len(jobs) % len(seeds)]
            j = chaos.submit(spec(f"chaos-{len(jobs) + 1}", seed))
            jobs.append(j)
            seed_of[j] = seed
            return j

        def submit_batch(n: int) -> None:
            for _ in range(n):
                submit_one()
            chaos.record("submitted through the API", "api", jobs=jobs[-n:])

        a, b = chaos.c.host("a"), chaos.c.host("b")
        batch1 = args.jobs // 2
        batch2 = (args.jobs - batch1) // 2
        timeline: list[tuple[str, Callable[[], None]]] = [
            # First, on an idle cluster (room to admit): a job submitted while the leader is frozen.
            ("freeze the leader", lambda: chaos.sigstop_leader(for_s=3 * args.leader_lease, submit=submit_one)),
            ("batch 1", lambda: submit_batch(batch1 - 1)),
            ("freeze worker a", lambda: chaos.sigstop_worker(a, for_s=2.5 * lease)),
            ("kill a trainer on b", lambda: chaos.sigkill_trainer(b)),
            ("kill the leader", lambda: chaos.sigkill_leader(down_s=3.0)),
            ("kill the API", lambda: chaos.sigkill_api(down_s=3.0)),
            ("batch 2", lambda: submit_batch(batch2)),
            (
                "storage read-only across a last step",
                lambda: chaos.read_only_across_last_step(for_s=20.0, steps=args.steps, every_steps=args.every),
            ),
            ("kill worker b past the lease", lambda: chaos.sigkill_worker(b, down_s=1.5 * lease)),
            ("kill Redis", lambda: chaos.sigkill_redis(down_s=3.0)),
            ("stop PostgreSQL", lambda: chaos.postgres_immediate_stop(down_s=lease / 2)),
            ("batch 3", lambda: submit_batch(args.jobs - batch1 - batch2)),
            (
                "PostgreSQL away past the leases, the leader dies",
                lambda: chaos.postgres_outage_with_leader_change(down_s=14.0, lease_s=lease),
            ),
            ("kill host a", lambda: chaos.sigkill_worker(a, down_s=1.5 * lease, whole_node=True)),
            ("freeze node b", lambda: chaos.sigstop_worker(b, for_s=2.5 * lease, whole_node=True)),
        ]
        for what, act in timeline:
            print(f"[{chaos.elapsed():7.1f} s] {what}", flush=True)
            try:
                act()
            except AssertionError as exc:  # e.g. nothing left training on that host: say so, carry on
                chaos.record(f"skipped: {what}", "-", why=str(exc))
            time.sleep(args.settle)
        print(f"[{chaos.elapsed():7.1f} s] waiting for every job to end", flush=True)
        finished = True
        try:
            chaos.wait_final(jobs, args.timeout)
        except AssertionError as exc:
            finished = False
            out["unfinished"] = str(exc)
        verdicts = check_invariants(chaos, jobs, {j: twins[seed_of[j]] for j in jobs}, verify=verify)
        verdicts += timeline_verdicts(chaos, args.leader_lease)
        walls = [w / t for j in jobs if (w := wall_s(chaos, j)) and (t := twin_wall[seed_of[j]])]
        consumer_died = {h: chaos.consumer_died(h) for h in (a, b)}
        out.update(
            {
                "finished": finished,
                "timeline": [asdict(f) for f in chaos.timeline],
                "invariants": {v.name: v.as_dict() for v in verdicts},
                "all_invariants_hold": finished and all(v.ok for v in verdicts),
                "twins": [{"seed": s, "job": j, "wall_s": twin_wall[s]} for s, j in twins.items()],
                "jobs": job_summaries(chaos, jobs),
                "twin_jobs": job_summaries(chaos, list(twins.values())),
                "wall_vs_twin": {
                    "median": statistics.median(walls) if walls else None,
                    "max": max(walls) if walls else None,
                },
                "restarts_total": sum(j["restarts"] for j in job_summaries(chaos, jobs)),
                # Issue 12 item 2: a Redis SIGKILL can kill Celery's consumer (kombu restore_unacked_once).
                "celery_consumer_died_after_redis_kill": consumer_died,
                "lost_incidents": _count(chaos, JobState.LOST),
                "recovered_events": _count(chaos, "RECOVERED"),
                "database_back_events": _count(chaos, "DATABASE_BACK"),
            }
        )
    out["duration_s"] = round(time.monotonic() - started, 1)
    out["load_average_end"] = os.getloadavg()
    out["workdir"] = str(tmp)
    return out


def _count(chaos: Chaos, type_: str) -> int:
    with chaos.c.sessionmaker()() as db:
        return len(db.scalars(select(Event.id).where(Event.type == type_)).all())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=30)
    p.add_argument("--seeds", type=int, default=3, help="distinct specs; one fault-free twin each")
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--lease", type=float, default=6.0)
    p.add_argument("--leader-lease", type=float, default=3.0, help="the schedulers' leader lease")
    p.add_argument("--final-retry", type=float, default=5.0, help="KILN_FINAL_CHECKPOINT_RETRY_S")
    p.add_argument("--step-sleep", type=float, default=0.2, help="test hook: seconds added to every step")
    p.add_argument("--settle", type=float, default=3.0, help="seconds between faults")
    p.add_argument("--timeout", type=float, default=900.0, help="for every job to end after the last fault")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos_bench.json")
    args = p.parse_args()
    # A SIGTERM (a background run stopped) unwinds like an exception: every process and server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run(args)
    except Exception:
        traceback.print_exc()
        raise
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for name, verdict in result["invariants"].items():
        print(f"{'ok  ' if verdict['ok'] else 'FAIL'} {name}" + "".join(f"\n     {f}" for f in verdict["failures"]))
    ratio = result["wall_vs_twin"]
    print(f"wall time vs the fault-free twin: median {ratio['median']}, max {ratio['max']}")
    print(f"wrote {args.out} ({result['duration_s']} s)")
    sys.exit(0 if result["all_invariants_hold"] else 1)


if __name__ == "__main__":
    main()
