"""What a row lock held through a commit costs one team's concurrent submissions on this machine's PostgreSQL: 32
threads, each an autocommit statement per submission into one team, as the API's submit writes (a team's place under
its cap taken by an UPDATE of the team's row, then the insert). Three ways, in the same run: the insert alone (no
cap: the ceiling), the lock held through a synchronous commit (each commit waits for the WAL's flush while the next
submission waits for the row), and the lock released at an asynchronous commit followed by a durable one of the
job's own row (``core.repositories.submissions``). Writes bench/results/api_bench_team_lock.json.

    .venv/bin/python bench/team_lock_probe.py [--seconds 4] [--threads 32]
    .venv/bin/python bench/team_lock_probe.py --smoke    # half a second a way, 4 threads (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("KILN_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS = ROOT / "bench" / "results" / "api_bench_team_lock.json"

SLOT = "UPDATE teams SET bound = bound + 1 WHERE id = 1 RETURNING id"
WAYS = {
    "insert_alone": "INSERT INTO jobs (team_id, spec) VALUES (1, '{}') RETURNING id",
    "lock_through_sync_commit": (
        f"WITH s AS ({SLOT}) INSERT INTO jobs (team_id, spec) SELECT id, '{{}}' FROM s RETURNING id"
    ),
    "lock_to_async_commit_then_durable": (
        f"WITH s AS ({SLOT}), j AS (INSERT INTO jobs (team_id, spec) SELECT id, '{{}}' FROM s RETURNING id)"
        " SELECT j.id, set_config('synchronous_commit', 'off', true) FROM j"
    ),
}
DURABLE = "UPDATE jobs SET spec = spec WHERE id = %s"


def measure(url: str, sql: str, *, durable: bool, threads: int, seconds: float) -> float:
    """Submissions per second."""
    done = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = [0.0]

    def worker(i: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            start.wait()
            while time.perf_counter() < stop[0]:
                row = conn.execute(sql).fetchone()
                if durable and row is not None:
                    conn.execute(DURABLE, (row[0],))
                done[i] += 1

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    stop[0] = time.perf_counter() + seconds
    start.wait()
    for w in workers:
        w.join()
    return sum(done) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="half a second a way, 4 threads: that it runs (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.seconds, args.threads = 0.5, 4
    name = f"kiln_lock_probe_{os.getpid()}_{secrets.token_hex(3)}"
    loadavg_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE teams (id int PRIMARY KEY, bound int NOT NULL)")
            conn.execute("INSERT INTO teams VALUES (1, 0)")
            conn.execute("CREATE TABLE jobs (id bigserial PRIMARY KEY, team_id int REFERENCES teams (id), spec jsonb)")
        per_s = {
            way: measure(url, sql, durable=way.endswith("durable"), threads=args.threads, seconds=args.seconds)
            for way, sql in WAYS.items()
        }
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    result = {
        "smoke": args.smoke,
        "threads": args.threads,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "loadavg_start": loadavg_start,
        "loadavg_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "submissions_per_s": per_s,
        "at": datetime.now(UTC).isoformat(),
    }
    for way, rate in per_s.items():
        print(f"{way:36}{rate:8.0f}/s")
    print(f"load average {result['loadavg_start']} -> {result['loadavg_end']}")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
