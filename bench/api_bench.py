"""API benchmark: submissions/s and list latency (P50/P99) at 32 concurrent clients with 100,000 jobs in the
table, against PostgreSQL on this machine and real uvicorn processes; beside the same measures for a bare
FastAPI endpoint doing the same insert and select (no auth, tenancy, validation, events or contracts), measured
in the same run. Writes bench/results/api_bench.json.

    .venv/bin/python bench/api_bench.py            # full run (100k rows, 10 s per phase); make bench-api
    .venv/bin/python bench/api_bench.py --smoke    # that it runs (500 rows, 1 s phases, 4 clients): CI's test

It exits 1 when a phase answered with errors: figures over refused requests measure nothing.
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
import tempfile
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
REDIS_URL = os.environ.get("KILN_BENCH_REDIS", "redis://127.0.0.1:6379/14")
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
    from core.models import Membership, QosClass, User
    from core.services import teams as teams_svc
    from core.services import tokens as tokens_svc
    from core.services.bootstrap import bootstrap_admin
    from core.services.principal import Principal

    sa_url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
    upgrade(sa_url)
    engine = make_engine(sa_url)
    with Session(engine) as db:
        root, _ = bootstrap_admin(db=db, name="root")
        admin = Principal(user_id=root.id, name=root.name, user_is_admin=True, scopes=frozenset({"admin"}))
        # As an admin creates them, so the teams may use the default QoS classes (silver among them) as any team.
        team = teams_svc.create_team(db=db, principal=admin, name="bench", quotas=[teams_svc.Quota("H200", 8)])
        other = teams_svc.create_team(db=db, principal=admin, name="other")
        user = User(name="bencher")
        db.add(user)
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
    return {
        "tokens": secrets_,
        "team_id": team_id,
        "user_id": user_id,
        "qos_id": qos_id,
        "copy_s": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------------------------------------------
# Servers and load.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(target: str, env: dict[str, str], workers: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        target,
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--no-access-log",
        "--log-level",
        "warning",
        "--loop",
        "uvloop",
        "--http",
        "httptools",
    ]
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
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# The load generator runs in a process of its own (``--client``): raw asyncio sockets, one keep-alive HTTP/1.1
# connection per client, requests serialized once, responses parsed only as far as status and Content-Length.
# It spends a few tens of microseconds of CPU per request (httpx spends about a millisecond), which matters when
# the client, uvicorn and PostgreSQL share two cores. It also samples the CPU time of itself, of the server's
# process tree, of the PostgreSQL backends serving the bench database and of the whole machine over exactly the
# measured window, so each phase reports CPU milliseconds per request beside wall throughput.


def _request_bytes(method: str, path: str, token: str, body: bytes | None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


def _cpu_snapshot(server_pid: int, pg_db: str) -> dict[str, float]:
    import psutil

    def tree_cpu(root: psutil.Process) -> float:
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    pg = 0.0
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if p.info["name"] == "postgres" and f" {pg_db} " in cmd:  # "postgres: user db host(port) state"
            try:
                t = p.cpu_times()
                pg += t.user + t.system
            except psutil.Error:
                pass
    machine = psutil.cpu_times()
    me = os.times()
    return {
        "client": me.user + me.system,
        "server": tree_cpu(psutil.Process(server_pid)),
        "postgres": pg,
        "machine_busy": sum(machine) - machine.idle - getattr(machine, "iowait", 0.0),
    }


async def _load(cfg: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    requests = [
        _request_bytes(cfg["method"], cfg["path"], t, cfg["body"].encode() if cfg["body"] else None)
        for t in cfg["tokens"]
    ]
    latencies: list[float] = []
    errors: dict[int, int] = {}
    start = time.perf_counter()
    measure_from = start + cfg["warmup_s"]
    stop = measure_from + cfg["seconds"]
    open_conns = len(requests)
    all_closed = loop.create_future()
    cpu: dict[str, dict[str, float]] = {}

    class Client(asyncio.Protocol):
        def __init__(self, request: bytes) -> None:
            self.request = request
            self.buf = b""
            self.sent = 0.0

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.send()

        def send(self) -> None:
            self.sent = time.perf_counter()
            self.transport.write(self.request)

        def data_received(self, data: bytes) -> None:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                raise RuntimeError("response without Content-Length: " + head[:200].decode(errors="replace"))
            eol = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : eol if eol > 0 else len(head)])
            if len(self.buf) < end + 4 + length:
                return
            status = int(self.buf[9:12])
            self.buf = self.buf[end + 4 + length :]
            done = time.perf_counter()
            if status >= 300:
                errors[status] = errors.get(status, 0) + 1
            elif measure_from <= self.sent < stop:
                latencies.append(done - self.sent)
            if done < stop:
                self.send()
            else:
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            nonlocal open_conns
            open_conns -= 1
            if open_conns == 0 and not all_closed.done():
                all_closed.set_result(None)

    async def sample(key: str, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        cpu[key] = _cpu_snapshot(cfg["server_pid"], cfg["pg_db"])

    samplers = [asyncio.ensure_future(sample("from", measure_from)), asyncio.ensure_future(sample("to", stop))]
    for req in requests:
        await loop.create_connection(lambda r=req: Client(r), cfg["host"], cfg["port"])  # type: ignore[misc]
    await asyncio.gather(*samplers)
    await asyncio.wait_for(all_closed, 60)
    latencies.sort()
    n = len(latencies)

    def pct(p: float) -> float:
        return latencies[min(n - 1, int(p * n))] * 1000 if n else float("nan")

    cpu_ms = {k: (cpu["to"][k] - cpu["from"][k]) * 1000 / n if n else float("nan") for k in cpu["to"]}
    return {
        "requests": n,
        "per_s": n / cfg["seconds"],
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_ms": statistics.fmean(latencies) * 1000 if n else float("nan"),
        "errors": errors,
        "cpu_ms_per_request": cpu_ms,
    }


def client_main(cfg_json: str) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    print(json.dumps(asyncio.run(_load(json.loads(cfg_json)))))


def load(
    url: str,
    server_pid: int,
    pg_db: str,
    method: str,
    path: str,
    tokens: list[str],
    seconds: float,
    body: dict[str, Any] | None,
    warmup_s: float,
) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    cfg = {
        "host": host,
        "port": int(port),
        "server_pid": server_pid,
        "pg_db": pg_db,
        "method": method,
        "path": path,
        "tokens": tokens,
        "seconds": seconds,
        "warmup_s": warmup_s,
        "body": json.dumps(body, separators=(",", ":")) if body is not None else None,
    }
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--client", json.dumps(cfg)],
        check=True,
        capture_output=True,
        text=True,
        timeout=seconds + warmup_s + 120,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    result["errors"] = {int(k): v for k, v in result["errors"].items()}
    return result


def measure(
    url: str, server_pid: int, pg_db: str, tokens: list[str], submit_path: str, list_path: str, seconds: float
) -> dict[str, Any]:
    warm = min(2.0, seconds / 4)
    submit = load(url, server_pid, pg_db, "POST", submit_path, tokens, seconds, SPEC, warm)
    listing = load(url, server_pid, pg_db, "GET", list_path, tokens, seconds, None, warm)
    return {"submit": submit, "list": listing}


def explain_list(pg_url: str, team_id: int, user_id: int) -> list[str]:
    """EXPLAIN ANALYZE of the list query kiln's API runs for the bench member on PostgreSQL (the repository's
    ``list_sql_pg``, with its parameters bound by the server as the API's are)."""
    from core.repositories.jobs import JobFilter, list_sql_pg

    sql, params = list_sql_pg(JobFilter(team_ids=[team_id]), 51)
    with psycopg.connect(pg_url) as conn:
        return [r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)]


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="that it runs: 500 rows, 1 s phases, 4 clients, 1 worker")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--clients", type=int, default=None, help="concurrent clients (default 32; --smoke 4)")
    ap.add_argument("--workers", type=int, default=None, help="uvicorn workers per server (default: the CPUs)")
    ap.add_argument(
        "--redis-limiter",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure kiln with Redis as the broker, so each request's rate limit is a Redis call",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = args.rows or (500 if args.smoke else 100_000)
    seconds = args.seconds or (1.0 if args.smoke else 10.0)
    args.clients = args.clients or (4 if args.smoke else 32)
    args.workers = args.workers or (1 if args.smoke else os.cpu_count() or 1)
    load_start = loadavg()
    print(f"load average at start (1/5/15 min): {load_start}; {os.cpu_count()} CPUs")

    # A home of its own each run: a deployment's storage belongs to one database (core.deployment refuses another).
    with bench_database() as pg_url, tempfile.TemporaryDirectory(prefix="kiln-bench-") as home:
        pg_db = pg_url.rsplit("/", 1)[1]
        seeded = seed(pg_url, rows, args.clients)
        print(
            f"seeded {rows} jobs by COPY in {seeded['copy_s']:.2f} s; {args.clients} clients, "
            f"{args.workers} uvicorn workers per server, {seconds:.0f} s per phase"
        )
        plan = explain_list(pg_url, seeded["team_id"], seeded["user_id"])
        print("kiln list query plan:\n  " + "\n  ".join(plan))
        sa_url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
        # Limits off: the bench measures the work of a request, not the limits that refuse them (the seeded team
        # already has more unfinished jobs than a team may keep by default). The team's cap is still checked on
        # every submission, at the same cost whatever the cap: its bound (core.repositories.submissions) is
        # counted once, at the team's first submission, then raised by one under the team's row lock.
        env = {
            "KILN_DATABASE_URL": sa_url,
            "KILN_RATE_LIMIT_PER_MINUTE": str(10**9),
            "KILN_RATE_LIMIT_BURST": str(10**6),
            "KILN_MAX_UNFINISHED_JOBS_PER_TEAM": str(10**9),
            "KILN_HOME": home,
        }
        with server("api.app:create_app", env, args.workers) as (url, pid):
            kiln = measure(url, pid, pg_db, seeded["tokens"], "/v1/jobs", "/v1/jobs?limit=50", seconds)
        redis_limited = None
        if args.redis_limiter:  # the shared limiter: one Lua call on Redis per authenticated request
            redis_env = {**env, "KILN_BROKER_URL": REDIS_URL}
            with server("api.app:create_app", redis_env, args.workers) as (url, pid):
                redis_limited = measure(url, pid, pg_db, seeded["tokens"], "/v1/jobs", "/v1/jobs?limit=50", seconds)
        bare_env = {**env, "BARE_IDS": f"{seeded['team_id']},{seeded['user_id']},{seeded['qos_id']}"}
        with server("bench.api_bench:bare_app", bare_env, args.workers) as (url, pid):
            bare = measure(url, pid, pg_db, seeded["tokens"], "/jobs", "/jobs", seconds)
    load_end = loadavg()

    ratio_submit = ratio(kiln["submit"]["per_s"], bare["submit"]["per_s"])
    ratio_p99 = ratio(kiln["list"]["p99_ms"], bare["list"]["p99_ms"])
    result = {
        "smoke": args.smoke,
        "rows": rows,
        "clients": args.clients,
        "workers": args.workers,
        "seconds": seconds,
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "list_plan": plan,
        "kiln": kiln,
        "bare": bare,
        "kiln_redis_limiter": redis_limited,
        "ratio": {
            "submit_per_s": ratio_submit,
            "list_p99": ratio_p99,
            "list_p50": ratio(kiln["list"]["p50_ms"], bare["list"]["p50_ms"]),
        },
        "targets": {"submit_per_s": 500, "list_p99_ms": 30},
        "meets_targets": kiln["submit"]["per_s"] >= 500 and kiln["list"]["p99_ms"] <= 30,
        "at": datetime.now(UTC).isoformat(),
    }
    print(f"{'':22}{'kiln API':>12}{'bare FastAPI':>14}{'ratio':>8}")
    print(f"{'submit/s':22}{kiln['submit']['per_s']:12.0f}{bare['submit']['per_s']:14.0f}{ratio_submit:8.2f}")
    for key in ("p50_ms", "p99_ms"):
        k, b = kiln["submit"][key], bare["submit"][key]
        print(f"{'submit ' + key:22}{k:12.1f}{b:14.1f}{ratio(k, b):8.2f}")
    print(
        f"{'list/s':22}{kiln['list']['per_s']:12.0f}{bare['list']['per_s']:14.0f}"
        f"{ratio(kiln['list']['per_s'], bare['list']['per_s']):8.2f}"
    )
    for key in ("p50_ms", "p99_ms"):
        k, b = kiln["list"][key], bare["list"][key]
        print(f"{'list ' + key:22}{k:12.1f}{b:14.1f}{ratio(k, b):8.2f}")
    print("CPU ms per request (measured window):")
    for phase in ("submit", "list"):
        for part in ("server", "postgres", "client", "machine_busy"):
            k, b = kiln[phase]["cpu_ms_per_request"][part], bare[phase]["cpu_ms_per_request"][part]
            print(f"{'  ' + phase + ' ' + part:22}{k:12.2f}{b:14.2f}{ratio(k, b):8.2f}")
    runs = {"kiln": kiln, "bare": bare, "kiln_redis_limiter": redis_limited}
    errors = {
        name: {p: got[p]["errors"] for p in ("submit", "list") if got[p]["errors"]} for name, got in runs.items() if got
    }
    result["errors"] = {name: phases for name, phases in errors.items() if phases}
    if result["errors"]:
        print(f"errors (status: count): {result['errors']}")
    if redis_limited is not None:
        print(f"{'':22}{'kiln+Redis':>12}{'kiln':>14}{'ratio':>8}  (rate limit shared through Redis)")
        for phase, key in (("submit", "per_s"), ("list", "per_s"), ("list", "p99_ms")):
            r, k = redis_limited[phase][key], kiln[phase][key]
            print(f"{phase + ' ' + key:22}{r:12.1f}{k:14.1f}{ratio(r, k):8.2f}")
        result["ratio"]["redis_limiter"] = {
            "submit_per_s": ratio(redis_limited["submit"]["per_s"], kiln["submit"]["per_s"]),
            "list_per_s": ratio(redis_limited["list"]["per_s"], kiln["list"]["per_s"]),
            "list_p99": ratio(redis_limited["list"]["p99_ms"], kiln["list"]["p99_ms"]),
        }
    print(f"load average at end (1/5/15 min): {load_end}")
    print(f"targets (>= 500 submit/s, list P99 <= 30 ms): {'met' if result['meets_targets'] else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    if result["errors"]:
        sys.exit("the API refused requests: these figures measure nothing (see the errors above)")


def ratio(a: float, b: float) -> float:
    """a / b, NaN where b measured nothing (a phase with no successful request)."""
    return a / b if b else float("nan")


if __name__ == "__main__":
    main()
