"""Retention benchmark: does the database stay bounded under a steady workload?

Two fresh PostgreSQL databases receive the same simulated workload, day after day on a simulated clock: every day
``--jobs`` jobs finish, each with ``--steps`` per-step metric rows (with the GPU sample a real step carries) and a
timeline of events. One database runs kiln's retention pass (core/retention.py) once a simulated day, followed by
the plain VACUUM autovacuum would run; the other (the baseline) keeps everything. After each day the bench records
both databases' sizes (``pg_database_size``) and the sizes of the tables retention prunes.

It prints the ratio of the baseline's size to the retained one's at the end, and each database's growth per day
over the last third of the run: with retention, the metrics and events tables stop growing once the oldest jobs
pass the retention ages; what still grows is the jobs' own rows (kept: a job's result and its bill).

    .venv/bin/python bench/retention_bench.py [--days 45] [--jobs 10] [--steps 400]

JSON: bench/results/retention_bench.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert, select, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from core.db import make_engine  # noqa: E402
from core.migrate import upgrade  # noqa: E402
from core.models import Event, Job, JobMetric, QosClass, Team  # noqa: E402
from core.retention import prune_database  # noqa: E402
from core.settings import Settings  # noqa: E402
from harness.services import temporary_database  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "retention_bench.json"
START = datetime(2026, 1, 1, tzinfo=UTC)
EVENTS = (
    "SUBMITTED",
    "ADMITTED",
    "RUNNING",
    "MEMORY_PREDICTION",
    "CHECKPOINT",
    "CHECKPOINT",
    "CHECKPOINT",
    "PREEMPTING",
    "QUEUED",
    "ADMITTED",
    "RUNNING",
    "CHECKPOINT",
    "EXIT",
    "SUCCEEDED",
)
TABLES = ("job_metrics", "events", "jobs")


def settings_for_bench() -> Settings:
    """Ages shorter than the defaults, so that a run of weeks reaches the steady state."""
    return Settings(
        retention_metrics_downsample_days=3,
        retention_metric_points=50,
        retention_metrics_days=14,
        retention_events_days=21,
        retention_deliveries_days=7,
    )


def one_day(engine: Engine, day: int, jobs: int, steps: int, team_id: int, qos_id: int) -> None:
    finished = START + timedelta(days=day, hours=12)
    with Session(engine) as db:
        ids = db.scalars(
            insert(Job).returning(Job.id),
            [
                {
                    "name": f"d{day}-{i}",
                    "team_id": team_id,
                    "spec": {"steps": steps},
                    "state": "SUCCEEDED",
                    "qos_class_id": qos_id,
                    "submitted_at": finished - timedelta(hours=2),
                    "finished_at": finished,
                    "updated_at": finished,
                    "last_step": steps,
                }
                for i in range(jobs)
            ],
        ).all()
        sample = {"gpus": [{"util_gpu": 97, "mem_used_bytes": 70_000_000_000, "pcie_tx": 1.2e9, "pcie_rx": 1.1e9}]}
        db.execute(
            insert(JobMetric),
            [
                {
                    "job_id": j,
                    "step": s,
                    "ts": finished - timedelta(seconds=steps - s),
                    "loss": 3.0 / s,
                    "grad_norm": 1.0,
                    "tokens_per_s": 1e5,
                    "step_time_s": 0.1,
                    "mfu": 0.4,
                    "mem_peak_bytes": 8 << 30,
                    "extra": sample,
                }
                for j in ids
                for s in range(1, steps + 1)
            ],
        )
        db.execute(
            insert(Event),
            [
                {
                    "job_id": j,
                    "team_id": team_id,
                    "type": t,
                    "message": f"{t.lower()} of job {j}",
                    "data": {"n": k},
                    "created_at": finished,
                }
                for j in ids
                for k, t in enumerate(EVENTS)
            ],
        )
        db.commit()


def sizes(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        out = {"database": int(conn.scalar(text("SELECT pg_database_size(current_database())")) or 0)}
        for table in TABLES:
            out[table] = int(conn.scalar(text(f"SELECT pg_total_relation_size('{table}')")) or 0)
        out["metric_rows"] = int(conn.scalar(text("SELECT count(*) FROM job_metrics")) or 0)
    return out


def vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TABLES:
            conn.execute(text(f"VACUUM {table}"))


def prepare(url: str) -> tuple[Engine, int, int]:
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        team = Team(name="bench")
        db.add(team)
        db.commit()
        qos = db.scalars(select(QosClass)).first()
        assert qos is not None
        return engine, team.id, qos.id


def growth_per_day(series: list[dict[str, Any]], key: str) -> float:
    tail = series[len(series) * 2 // 3 :]
    return (tail[-1][key] - tail[0][key]) / max(len(tail) - 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=45)
    parser.add_argument("--jobs", type=int, default=10, help="jobs finishing per simulated day")
    parser.add_argument("--steps", type=int, default=400, help="per-step metric rows per job")
    args = parser.parse_args()
    settings = settings_for_bench()
    series: dict[str, list[dict[str, Any]]] = {"baseline": [], "retention": []}
    prune_s: list[float] = []
    with temporary_database("kiln_bench_base") as base_url, temporary_database("kiln_bench_ret") as ret_url:
        base, base_team, base_qos = prepare(base_url)
        ret, ret_team, ret_qos = prepare(ret_url)
        for day in range(args.days):
            one_day(base, day, args.jobs, args.steps, base_team, base_qos)
            one_day(ret, day, args.jobs, args.steps, ret_team, ret_qos)
            t0 = time.perf_counter()
            with Session(ret) as db:
                report = prune_database(db, settings, START + timedelta(days=day + 1))
                db.commit()
            prune_s.append(time.perf_counter() - t0)
            vacuum(base)  # the same maintenance for both: only retention differs
            vacuum(ret)
            for name, engine in (("baseline", base), ("retention", ret)):
                series[name].append({"day": day + 1, **sizes(engine)})
            last = series["retention"][-1]
            print(
                f"day {day + 1:3d}: baseline {series['baseline'][-1]['database'] / 2**20:7.1f} MiB, "
                f"retention {last['database'] / 2**20:7.1f} MiB ({last['metric_rows']} metric rows; {report})"
            )
        base.dispose()
        ret.dispose()
    final_base, final_ret = series["baseline"][-1], series["retention"][-1]
    summary = {
        "ratio_database_size_baseline_over_retention": final_base["database"] / final_ret["database"],
        "database_growth_bytes_per_day_last_third": {
            "baseline": growth_per_day(series["baseline"], "database"),
            "retention": growth_per_day(series["retention"], "database"),
        },
        "pruned_tables_growth_bytes_per_day_last_third": {
            name: growth_per_day(series[name], "job_metrics") + growth_per_day(series[name], "events")
            for name in series
        },
        "metric_rows_final": {"baseline": final_base["metric_rows"], "retention": final_ret["metric_rows"]},
        "prune_pass_s": {"median": sorted(prune_s)[len(prune_s) // 2], "max": max(prune_s)},
    }
    print(json.dumps(summary, indent=2))
    RESULTS.write_text(
        json.dumps(
            {
                "description": __doc__.split("\n\n")[0],
                "workload": {
                    "days": args.days,
                    "jobs_per_day": args.jobs,
                    "steps_per_job": args.steps,
                    "events_per_job": len(EVENTS),
                },
                "retention_settings": {k: v for k, v in settings.model_dump().items() if k.startswith("retention_")},
                "summary": summary,
                "series": series,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
