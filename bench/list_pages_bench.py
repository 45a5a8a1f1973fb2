"""List pages read in SQL against lists loaded whole and cut in memory, on PostgreSQL on this machine.

The GPU list of a 1,000-host cluster (8,000 GPUs, by host and index) and the user list (10,000 users, by name),
walked a page of 100 at a time: each page read by a keyset scan (``api.routers.common.paged_query``, what the API
does) beside the same pages cut from the whole list read again for each page (``paged``, what it did before),
alternating, in the same run. The service calls the API makes, without HTTP. Writes
bench/results/list_pages_bench.json.

    .venv/bin/python bench/list_pages_bench.py
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api_bench import bench_database  # bench/ is on the path when this runs as a script
from sqlalchemy import insert
from sqlalchemy.orm import Session

from api.routers.common import paged, paged_query
from core.db import make_engine
from core.migrate import upgrade
from core.models import GPU, Host, User
from core.services import cluster as cluster_svc
from core.services import users as users_svc
from core.services.principal import Principal

OUT = Path(__file__).parent / "results" / "list_pages_bench.json"
PAGE = 100


def seed(db: Session, hosts: int, users: int) -> None:
    db.execute(
        insert(Host), [{"name": f"gpu-{i:05d}", "queue": f"host.gpu-{i:05d}", "state": "UP"} for i in range(hosts)]
    )
    ids = dict(db.query(Host.name, Host.id).all())
    db.execute(
        insert(GPU),
        [
            {
                "host_id": ids[f"gpu-{h:05d}"],
                "uuid": f"GPU-{h}-{i}",
                "index": i,
                "model": "H200",
                "memory_bytes": 141 << 30,
            }
            for h in range(hosts)
            for i in range(8)
        ],
    )
    db.execute(insert(User), [{"name": f"user-{i:06d}"} for i in range(users)])
    db.commit()


def walk(one_page: Callable[[str | None], tuple[list[Any], str | None]]) -> tuple[float, int]:
    """Seconds to read every page, and the items read."""
    t0 = time.perf_counter()
    cursor, n = None, 0
    while True:
        rows, cursor = one_page(cursor)
        n += len(rows)
        if cursor is None:
            return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with bench_database() as pg_url:
        url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
        upgrade(url)
        engine = make_engine(url)
        admin = Principal(user_id=0, name="bench", user_is_admin=True, scopes=frozenset({"read", "write", "admin"}))
        with Session(engine) as db:
            seed(db, args.hosts, args.users)
        lists: dict[str, dict[str, Callable[[Session, str | None], tuple[list[Any], str | None]]]] = {
            "gpus": {
                "sql": lambda db, c: paged_query(
                    functools.partial(cluster_svc.gpus, db=db), lambda g: (g[1], g[0].index), ("", 0), PAGE, c
                ),
                "in_memory": lambda db, c: paged(cluster_svc.gpus(db=db), lambda g: (g[1], g[0].index), PAGE, c),
            },
            "users": {
                "sql": lambda db, c: paged_query(
                    functools.partial(users_svc.list_users, db=db, principal=admin),
                    lambda u: (u.name,),
                    ("",),
                    PAGE,
                    c,
                ),
                "in_memory": lambda db, c: paged(
                    users_svc.list_users(db=db, principal=admin), lambda u: (u.name,), PAGE, c
                ),
            },
        }
        results: dict[str, Any] = {}
        for name, ways in lists.items():
            times: dict[str, list[float]] = {way: [] for way in ways}
            items: dict[str, int] = {}
            for _ in range(args.repeat):
                for way, one_page in ways.items():  # alternating: the box's noise falls on both
                    with Session(engine) as db:
                        seconds, items[way] = walk(functools.partial(one_page, db))
                    times[way].append(seconds)
            assert items["sql"] == items["in_memory"], items
            sql, mem = statistics.median(times["sql"]), statistics.median(times["in_memory"])
            results[name] = {
                "items": items["sql"],
                "pages": -(-items["sql"] // PAGE),
                "sql_walk_s": round(sql, 3),
                "in_memory_walk_s": round(mem, 3),
                "sql_per_page_ms": round(1000 * sql / -(-items["sql"] // PAGE), 2),
                "in_memory_per_page_ms": round(1000 * mem / -(-items["sql"] // PAGE), 2),
                "speedup": round(mem / sql, 1),
                "runs_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
            }
            print(
                f"{name}: {items['sql']} items in pages of {PAGE}: SQL keyset {sql:.2f} s, whole list cut in memory "
                f"{mem:.2f} s ({mem / sql:.1f}x)"
            )
        engine.dispose()
    summary = {
        "hosts": args.hosts,
        "users": args.users,
        "page": PAGE,
        "repeat": args.repeat,
        "database": "PostgreSQL (127.0.0.1:5432)",
        "lists": results,
    }
    OUT.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
