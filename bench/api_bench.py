"""API benchmark: submissions/s and list latency (P50/P99) at 32 concurrent clients with 100,000 jobs in the
table, against PostgreSQL on this machine and real uvicorn processes; beside the same measures for a bare
FastAPI endpoint doing the same insert and select (no auth, tenancy, validation, events or contracts), measured
in the same run. Writes bench/results/api_bench.json.

    .venv/bin/python bench/api_bench.py            # full run (100k rows, 10 s per phase)
    .venv/bin/python bench/api_bench.py --quick    # smoke test (2k rows, 2 s per phase)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN = os.environ.get("KILN_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS = ROOT / "bench" / "results" / "api_bench.json"
SPEC: dict[str, Any] = {
    "name": "bench",
    "team": "bench",
    "recipe": {"name": "gpt", "hyperparameters": {"size": "tiny", "lr": 0.003}},
    "steps": 100,
    "resources": {"gpus": 1, "gpu_type": "H200"},
}


# --------------------------------------------------------------------------------------------------------------
# The baseline: a bare FastAPI app doing the same INSERT (one jobs row) and the same SELECT (the list page).


def bare_app() -> Any:
    """``uvicorn bench.api_bench:bare_app --factory``: no auth, no validation beyond JSON, no events."""
    from sqlalchemy import text

    from core.db import make_engine

    engine = make_engine(os.environ["KILN_DATABASE_URL"])
    team_id, user_id, qos_id = (int(x) for x in os.environ["BARE_IDS"].split(","))
    app = FastAPI()
    insert = text(
        "INSERT INTO jobs (name, team_id, user_id, spec, state, qos_class_id, priority, gpus, gpu_type,"
        " restart_count, fencing_token, cancel_requested, preempt_requested, last_step, submitted_at, updated_at)"
        " VALUES (:name, :team, :user, CAST(:spec AS JSONB), 'QUEUED', :qos, 500, 1, 'H200', 0, 0, false, false,"
        " 0, now(), now()) RETURNING id"
    )
    select = text(
        "SELECT jobs.*, teams.name AS team, users.name AS username, qos_classes.name AS qos FROM jobs"
        " JOIN teams ON teams.id = jobs.team_id LEFT JOIN users ON users.id = jobs.user_id"
        " JOIN qos_classes ON qos_classes.id = jobs.qos_class_id"
        " WHERE jobs.team_id IN (:team) ORDER BY jobs.id DESC LIMIT 51"
    )

    @app.post("/jobs", status_code=201)
    async def submit(request: Request) -> dict[str, Any]:
        body = await request.json()
        with engine.begin() as conn:
            job_id = conn.execute(
                insert,
                {"name": body["name"], "team": team_id, "user": user_id, "spec": json.dumps(body), "qos": qos_id},
            ).scalar_one()
        return {"id": job_id, **body}

    @app.get("/jobs")
    def list_jobs() -> dict[str, Any]:
        with engine.connect() as conn:
            rows = conn.execute(select, {"team": team_id}).mappings().all()
        return {"items": [dict(r) for r in rows[:50]], "next_cursor": None}

    return app


# --------------------------------------------------------------------------------------------------------------
# Set-up: a database of our own, migrated, seeded, 100k jobs by COPY.


@contextmanager
def bench_database() -> Iterator[str]:
    name = f"kiln_bench_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        for attempt in range(5):  # PostgreSQL may be restarting (other suites run chaos tests on this machine)
            try:
                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.OperationalError:
                time.sleep(1 + attempt)


def seed(pg_url: str, rows: int, clients: int) -> dict[str, Any]:
    from sqlalchemy.orm import Session

    from core.db import make_engine
    from core.migrate import upgrade
    from core.models import Membership, QosClass, Team, TeamQuota, User
    from core.services import tokens as tokens_svc
    from core.services.bootstrap import bootstrap_admin
    from core.services.principal import Principal

    sa_url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
    upgrade(sa_url)
    engine = make_engine(sa_url)
    with Session(engine) as db:
        bootstrap_admin(db=db, name="root")
        team = Team(name="bench", quotas=[TeamQuota(gpu_type="H200", nominal=8)])
        other = Team(name="other")
        user = User(name="bencher")
        db.add_all([team, other, user])
        db.flush()
        db.add(Membership(user_id=user.id, team_id=team.id, role="member"))
        who = Principal(user_id=user.id, name=user.name)
        secrets_ = [tokens_svc.issue(db=db, principal=who, name=f"c{i}")[1] for i in range(clients)]
        silver = db.query(QosClass).filter_by(name="silver").one()
        ids = (team.id, other.id, user.id, silver.id)
        db.commit()
    engine.dispose()
    team_id, other_id, user_id, qos_id = ids
    started = time.perf_counter()
    spec = json.dumps(SPEC)
    now = datetime.now(UTC).isoformat()
    buf = io.StringIO()
    for i in range(rows):  # half in the bench team, half in another (the member sees only its own)
        t = team_id if i % 2 == 0 else other_id
        state = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED")[i % 4]
        buf.write(f"bench-{i}\t{t}\t{user_id}\t{spec}\t{state}\t{qos_id}\t500\t1\tH200\t0\t0\tf\tf\t0\t{now}\t{now}\n")
    with psycopg.connect(pg_url) as conn:
        with conn.cursor().copy(
            "COPY jobs (name, team_id, user_id, spec, state, qos_class_id, priority, gpus, gpu_type, restart_count,"
            " fencing_token, cancel_requested, preempt_requested, last_step, submitted_at, updated_at) FROM STDIN"
        ) as copy:
            copy.write(buf.getvalue())
        conn.execute("ANALYZE")
    return {"tokens": secrets_, "team_id": team_id, "user_id": user_id, "qos_id": qos_id,
            "copy_s": time.perf_counter() - started}  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# Servers and load.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(target: str, env: dict[str, str], workers: int) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", target, "--factory", "--host", "127.0.0.1", "--port", str(port),
           "--workers", str(workers), "--no-access-log", "--log-level", "warning", "--loop", "uvloop",
           "--http", "httptools"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(url + "/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise RuntimeError(f"{target} did not start")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


async def load(url: str, method: str, path: str, tokens: list[str], seconds: float, body: dict[str, Any] | None,
               warmup_s: float) -> dict[str, Any]:  # fmt: skip
    latencies: list[float] = []
    errors: dict[int, int] = {}
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop = measure_from + seconds

    async def client(token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as c:
            while (now := time.perf_counter()) < stop:
                r = await c.request(method, path, json=body)
                done = time.perf_counter()
                if r.status_code >= 300:
                    errors[r.status_code] = errors.get(r.status_code, 0) + 1
                elif now >= measure_from:
                    latencies.append(done - now)

    await asyncio.gather(*(client(t) for t in tokens))
    latencies.sort()
    n = len(latencies)

    def pct(p: float) -> float:
        return latencies[min(n - 1, int(p * n))] * 1000 if n else float("nan")

    return {"requests": n, "per_s": n / seconds, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(latencies) * 1000 if n else float("nan"), "errors": errors}  # fmt: skip


def measure(url: str, tokens: list[str], submit_path: str, list_path: str, seconds: float) -> dict[str, Any]:
    warm = min(2.0, seconds / 4)
    submit = asyncio.run(load(url, "POST", submit_path, tokens, seconds, SPEC, warm))
    listing = asyncio.run(load(url, "GET", list_path, tokens, seconds, None, warm))
    return {"submit": submit, "list": listing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: 2k rows, 2 s phases")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="uvicorn workers per server")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = args.rows or (2_000 if args.quick else 100_000)
    seconds = args.seconds or (2.0 if args.quick else 10.0)

    with bench_database() as pg_url:
        seeded = seed(pg_url, rows, args.clients)
        print(f"seeded {rows} jobs by COPY in {seeded['copy_s']:.2f} s; {args.clients} clients, "
              f"{args.workers} uvicorn workers per server, {seconds:.0f} s per phase")  # fmt: skip
        sa_url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
        env = {"KILN_DATABASE_URL": sa_url, "KILN_RATE_LIMIT_PER_MINUTE": str(10**9),
               "KILN_RATE_LIMIT_BURST": str(10**6), "KILN_HOME": str(ROOT / ".kiln-bench")}  # fmt: skip
        with server("api.app:create_app", env, args.workers) as url:
            kiln = measure(url, seeded["tokens"], "/v1/jobs", "/v1/jobs?limit=50", seconds)
        bare_env = {**env, "BARE_IDS": f"{seeded['team_id']},{seeded['user_id']},{seeded['qos_id']}"}
        with server("bench.api_bench:bare_app", bare_env, args.workers) as url:
            bare = measure(url, seeded["tokens"], "/jobs", "/jobs", seconds)

    ratio_submit = kiln["submit"]["per_s"] / bare["submit"]["per_s"]
    ratio_p99 = kiln["list"]["p99_ms"] / bare["list"]["p99_ms"]
    result = {
        "rows": rows, "clients": args.clients, "workers": args.workers, "seconds": seconds, "cpus": os.cpu_count(),
        "kiln": kiln, "bare": bare,
        "ratio": {"submit_per_s": ratio_submit, "list_p99": ratio_p99,
                  "list_p50": kiln["list"]["p50_ms"] / bare["list"]["p50_ms"]},
        "targets": {"submit_per_s": 500, "list_p99_ms": 30},
        "meets_targets": kiln["submit"]["per_s"] >= 500 and kiln["list"]["p99_ms"] <= 30,
        "at": datetime.now(UTC).isoformat(),
    }  # fmt: skip
    print(f"{'':14}{'kiln API':>14}{'bare FastAPI':>14}{'ratio':>9}")
    print(f"{'submit/s':14}{kiln['submit']['per_s']:14.0f}{bare['submit']['per_s']:14.0f}{ratio_submit:9.2f}")
    for key in ("p50_ms", "p99_ms"):
        k, b = kiln["list"][key], bare["list"][key]
        print(f"{'list ' + key:14}{k:14.1f}{b:14.1f}{k / b:9.2f}")
    print(f"list/s        {kiln['list']['per_s']:14.0f}{bare['list']['per_s']:14.0f}")
    if kiln["submit"]["errors"] or kiln["list"]["errors"]:
        print("errors:", kiln["submit"]["errors"], kiln["list"]["errors"])
    print(f"targets (>= 500 submit/s, list P99 <= 30 ms): {'met' if result['meets_targets'] else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
