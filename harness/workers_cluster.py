"""Several real worker processes (``python -m workers``) acting as hosts, for the failover and worker tests, and
the real scheduler (``scheduler.live.loop.run_cycle``: reconcile -> snapshot -> plan -> apply -> commit -> dispatch)
running beside them in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
import psutil
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from core import db as core_db
from core.code_archive import pack_bytes
from core.db import utcnow
from core.migrate import upgrade
from core.models import Attempt, Host, Job, QosClass, Team, TeamQuota, User
from core.policy_config import PolicyConfig
from core.services import artifacts as artifacts_service
from core.services import jobs as jobs_service
from core.services.bootstrap import bootstrap_admin
from core.services.principal import Principal
from core.settings import Settings, get_settings
from core.spec import parse_spec_data
from core.trainer_protocol import ENV_TEST_HOOKS
from harness.services import free_port, process_tree, redis_url, temporary_database
from scheduler.live.apply import apply_all
from scheduler.live.loop import CycleResult, run_cycle
from scheduler.policy.decisions import Admission, Decisions, PlacementEntry
from workers import celery_app
from workers.dispatch import dispatch_attempt

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


# The main job, fast to restart. A test that acts mid-run slows its steps down on the worker, not in the spec:
# ``start_worker(..., hooks=slow_steps(0.15))``.
def tiny_spec(name: str, *, steps: int = 60, every_steps: int = 10, **hp: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": "default",
        "steps": steps,
        "seed": 1234,
        "recipe": {
            "name": "gpt",
            "hyperparameters": {
                "size": "tiny",
                "corpus": "stdlib",
                "batch_size": 8,
                "seq_len": 128,
                "lr": 0.003,
                "heartbeat_s": 0.5,
                **hp,
            },
        },
        "resources": {"gpus": 0, "cpu_slots": 1},
        "parallelism": "ddp",
        "compile": {"mode": "off"},
        "precision": "fp32",
        "checkpointing": {"every_steps": every_steps, "keep_last": 3, "asynchronous": False},
        "sla": {"qos": "silver"},
    }


def slow_steps(seconds: float) -> dict[str, Any]:
    """The trainer's test hooks (``KILN_TEST_HOOKS``) that make every step take ``seconds`` more."""
    return {"sleep_per_step_s": seconds}


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``predicate`` until it returns something true. A database error (a test that restarts PostgreSQL)
    counts as "not yet" and is named if time runs out; any other error is the test's and propagates."""
    deadline = time.monotonic() + timeout
    last_error: DBAPIError | None = None
    while True:
        try:
            value = predicate()
        except DBAPIError as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            cause = f" (last database error: {last_error.orig!r})" if last_error is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{cause}")
        time.sleep(interval)


class Cluster:
    """Environment shared by the test process and its workers; the test process uses the same settings."""

    of_this_test: ClassVar[list[Cluster]] = []  # a failed test reports their logs (tests/e2e/conftest.py)

    def __init__(
        self,
        tmp: Path,
        *,
        database_url: str,
        broker_url: str,
        lease_s: float = 8.0,
        heartbeat_s: float = 1.0,
        visibility_timeout_s: float | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        self.tmp = tmp
        self.suffix = secrets.token_hex(3)
        self.env = {
            **os.environ,
            "KILN_HOME": str(tmp / "home"),
            "KILN_DATABASE_URL": database_url,
            "KILN_BROKER_URL": broker_url,
            "KILN_STORAGE_DIR": str(tmp / "storage"),
            "KILN_LEASE_S": str(lease_s),
            "KILN_HEARTBEAT_INTERVAL_S": str(heartbeat_s),
            # Gang tests of several runs share this machine: each cluster its own rendezvous ports (attempt ids
            # start at 1 in every test database, so the default base would collide).
            "KILN_RENDEZVOUS_PORT_BASE": str(20000 + secrets.randbelow(1200) * 10),
            "PYTHONPATH": str(ROOT),
        }
        if visibility_timeout_s is not None:
            self.env["KILN_BROKER_VISIBILITY_TIMEOUT_S"] = str(visibility_timeout_s)
        self.env.update(extra_env or {})
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.services: dict[str, subprocess.Popen[bytes]] = {}  # the API, schedulers: see start_service
        self.api_url: str | None = None
        self.logs: dict[str, Path] = {}
        self._saved: dict[str, str | None] = {}
        Cluster.of_this_test.append(self)

    def host(self, label: str) -> str:
        """Host names unique to this run: other engineers' tests share the Redis server."""
        return f"{label}-{self.suffix}"

    def activate(self) -> Settings:
        """Point this process's settings, engine and Celery app at the cluster."""
        for key, value in self.env.items():
            if key.startswith("KILN_"):
                self._saved.setdefault(key, os.environ.get(key))
                os.environ[key] = value
        self._clear_caches()
        (self.tmp / "home").mkdir(parents=True, exist_ok=True)
        return get_settings()

    def deactivate(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._clear_caches()

    @staticmethod
    def _clear_caches() -> None:
        core_db.get_engine().dispose()
        get_settings.cache_clear()
        core_db.get_engine.cache_clear()
        core_db.get_sessionmaker.cache_clear()
        celery_app.get_app.cache_clear()

    def sessionmaker(self) -> sessionmaker[Session]:
        return core_db.get_sessionmaker()

    def start_worker(
        self, label: str, *, cpu_slots: int = 1, hooks: dict[str, Any] | None = None, **settings: str
    ) -> str:
        """``hooks``: the trainer's test hooks for every attempt this worker runs, set the one way they can be:
        in the worker's own environment (``KILN_TEST_HOOKS``), which it passes to the ranks it launches.
        ``settings``: more of this worker's own environment (e.g. ``KILN_HANG_TIMEOUT_S``)."""
        name = self.host(label)
        log = self.tmp / f"worker-{label}.log"
        self.logs[name] = log
        env = {**self.env, **settings, **({ENV_TEST_HOOKS: json.dumps(hooks)} if hooks else {})}
        self.workers[name] = subprocess.Popen(
            [sys.executable, "-m", "workers", "--host", name, "--cpu-slots", str(cpu_slots), "--address", "127.0.0.1"],
            env=env,
            cwd=ROOT,
            stdout=open(log, "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return name

    def start_service(self, label: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        """Another kiln process (the API, a scheduler) with the cluster's environment plus ``env``; its output
        goes to ``<label>.log`` in the cluster's directory."""
        log = self.tmp / f"{label}.log"
        self.logs[label] = log
        self.services[label] = subprocess.Popen(
            argv,
            env={**self.env, **env, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
            stdout=open(log, "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self.services[label]

    def start_api(self, label: str = "api") -> str:
        """The API under uvicorn, as ``kiln up`` and the compose file run it; back on the same port after a
        restart. Returns its URL once ``/readyz`` answers."""
        if self.api_url is None:
            self.api_url = f"http://127.0.0.1:{free_port()}"
        port = self.api_url.rsplit(":", 1)[1]
        self.start_service(
            label,
            [
                sys.executable,
                "-m",
                "uvicorn",
                "api.app:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                port,
                "--no-access-log",
            ],
        )
        wait_for(self.api_ready, 120, "the API ready")
        return self.api_url

    def api_ready(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start_scheduler(self, label: str, *, interval_s: float, **env: str) -> subprocess.Popen[bytes]:
        """``python -m scheduler``: campaigns for the lead, then runs a cycle on each NOTIFY and every
        ``interval_s``."""
        return self.start_service(
            label, [sys.executable, "-m", "scheduler"], KILN_SCHEDULER_INTERVAL_S=str(interval_s), **env
        )

    def tree(self, name: str) -> list[psutil.Process]:
        """The worker and every process under it, as psutil handles, each of which checks before a signal that its
        pid was not reused; empty once the worker has exited. Never ``psutil.Process(pid)`` of a worker that may
        have exited: once reaped, its pid can be another test's process (pids wrap around within a CI run), whose
        children a "kill what it left behind" would then kill."""
        proc = self.workers[name]
        # Exited (and reaped by this poll if it had not been): the pid is no longer its own. Unreaped, it still is.
        return [] if proc.poll() is not None else process_tree(proc.pid)

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL the worker and every process under it (torchrun, the ranks), all at once."""
        killed = []
        for p in self.tree(name):
            with contextlib.suppress(psutil.Error):
                p.kill()
                killed.append(p.pid)
        self.workers[name].wait(10)
        return killed

    def freeze_worker(self, name: str) -> list[psutil.Process]:
        """SIGSTOP the worker and every process under it (a frozen VM, a host that stopped answering): no
        connection is reset, nothing exits. Returns the processes for :meth:`thaw`."""
        tree = self.tree(name)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.suspend()
        return tree

    @staticmethod
    def thaw(tree: list[psutil.Process]) -> None:
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.resume()

    def trainer_pids(self, name: str) -> list[int]:
        return [p.pid for p in self.tree(name)[1:]]

    def stop_all(self) -> None:
        # Each worker's processes as they are now, before any exits: what a worker leaves behind is killed below
        # through these handles, never looked up again by a pid that may have been reused since.
        trees = {name: self.tree(name) for name in self.workers}
        for proc in [*self.services.values(), *self.workers.values()]:
            if proc.poll() is None:  # not reaped: the pid is still this process's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.services.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name, proc in list(self.workers.items()):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill_worker(name)
        for tree in trees.values():  # anything a worker left behind (it should have stopped its trainers)
            for p in tree[1:]:
                with contextlib.suppress(psutil.Error):
                    p.kill()

    def failure_report(self, lines: int = 6) -> str:
        """The last lines of every log this cluster wrote - its processes' and each attempt's - and of each rank's
        telemetry: what a CI failure shows of what the processes were doing (the directory is gone by then)."""
        storage = self.tmp / "storage"
        paths = [
            *self.logs.values(),
            *sorted(storage.glob("logs/*/*.log")),
            *sorted(storage.glob("runs/*/*/telemetry/rank*.jsonl")),
        ]
        out = []
        for path in paths:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()
                if path.suffix == ".jsonl":  # the rank's events, and its last record of any kind
                    tail = [line for line in tail[:-1] if '"kind":"event"' in line] + tail[-1:]
                tail = tail[-lines:]
                out.append(f"--- {path.relative_to(self.tmp)}\n" + "\n".join(line[:300] for line in tail))
        return "\n".join(out)

    def log_text(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def submit_job(self, spec: dict[str, Any], **terms: Any) -> int:
        """:func:`submit` in a session of its own, committed; the job's id."""
        with self.sessionmaker()() as db:
            job_id = submit(db, spec, **terms).id
            db.commit()
        return job_id

    def scheduler_thread(self, *, interval_s: float = 0.5, config: PolicyConfig | None = None) -> SchedulerThread:
        """The real scheduler on this cluster (:class:`SchedulerThread`), started: ``stop()`` it in a ``finally``."""
        return SchedulerThread(self.sessionmaker(), get_settings(), interval_s=interval_s, config=config).start()


@contextmanager
def cluster(tmp: Path, *, database_url: str, broker_url: str, **kw: Any) -> Iterator[Cluster]:
    if database_url.startswith("postgresql"):
        upgrade(database_url)
    c = Cluster(tmp, database_url=database_url, broker_url=broker_url, **kw)
    c.activate()
    if not database_url.startswith("postgresql"):
        upgrade(database_url)
    try:
        yield c
    finally:
        c.stop_all()
        c.deactivate()


@contextmanager
def cluster_on_new_database(tmp: Path, database: str, *, broker_url: str | None = None, **kw: Any) -> Iterator[Cluster]:
    """A :func:`cluster` on a PostgreSQL database of its own (named ``database`` plus a suffix, dropped afterwards)
    and the shared Redis, or the test's own broker at ``broker_url``."""
    with (
        temporary_database(database) as url,
        cluster(tmp, database_url=url, broker_url=broker_url or redis_url(), **kw) as c,
    ):
        yield c


# ------------------------------------------------------------------------------------- submission and admission

CPU_QUOTA = 8  # CPU slots the test teams may use (their quota row for gpu_type "cpu")
CLUSTER_ADMIN = "cluster-admin"


def submit(
    db: Session,
    spec: dict[str, Any],
    *,
    max_restarts: int = 3,
    recovery_objective_s: float = 60.0,
    checkpoint_interval_s: float = 600.0,
    cpu_quota: int = CPU_QUOTA,
) -> Job:
    """Submit ``spec`` through the API's own submission service (``core.services.jobs.submit``), as the cluster's
    admin, with these SLA terms; the team gets at least ``cpu_quota`` CPU slots (the scheduler admits CPU jobs
    against the team's ``cpu`` quota and the hosts' CPU slots) and a restart limit that allows ``max_restarts``."""
    principal = cluster_admin(db)
    team = _team(db, spec.get("team", "default"))
    quota = db.scalars(select(TeamQuota).where(TeamQuota.team_id == team.id, TeamQuota.gpu_type == "cpu")).first()
    if quota is None:
        db.add(TeamQuota(team_id=team.id, gpu_type="cpu", nominal=cpu_quota))
    else:
        quota.nominal = max(quota.nominal, cpu_quota)
    team.restart_limit = max(team.restart_limit, max_restarts)  # an admin's setting, which submit enforces
    db.flush()
    terms = {
        "max_restarts": max_restarts,
        "recovery_time_objective_s": recovery_objective_s,
        "checkpoint_interval_s": checkpoint_interval_s,
    }
    parsed = parse_spec_data({**spec, "sla": {**(spec.get("sla") or {}), **terms}})
    view = jobs_service.submit(db=db, principal=principal, spec=parsed)
    job = db.get(Job, view.id)
    assert job is not None
    return job


def _team(db: Session, name: str) -> Team:
    team = db.scalars(select(Team).where(Team.name == name)).first()
    if team is None:
        team = Team(name=name, qos_classes=list(db.scalars(select(QosClass))))
        db.add(team)
        db.flush()
    return team


def upload_code(db: Session, team: str, directory: Path) -> str:
    """Pack ``directory`` and store it as ``team``'s archive through the API's own service, as ``kiln submit
    --workdir`` does; returns its digest for the spec's ``code.digest``."""
    _team(db, team)
    blob, _ = pack_bytes(directory)
    digest = hashlib.sha256(blob).hexdigest()
    settings = get_settings()
    upload = artifacts_service.tmp_dir(settings.resolved_storage_dir) / f"test-upload-{digest}"
    upload.write_bytes(blob)
    artifacts_service.store(
        db=db, principal=cluster_admin(db), team=team, digest=digest, upload=upload, settings=settings
    )
    return digest


def cluster_admin(db: Session) -> Principal:
    """The admin the tests act as: bootstrapped (with the ``default`` team) the way ``kiln up`` does, once."""
    user = db.scalars(select(User).where(User.name == CLUSTER_ADMIN)).first()
    if user is None:
        user, _ = bootstrap_admin(db=db, name=CLUSTER_ADMIN, force=True)
    return Principal(user_id=user.id, name=user.name, user_is_admin=True, scopes=frozenset({"read", "write", "admin"}))


def admit(db: Session, job: Job, host: Host, *, slots: int | None = None) -> Attempt:
    """Admit ``job`` onto ``host`` through the scheduler's own write path (``scheduler.live.apply.apply_all``), for
    tests that need an attempt on a chosen host without running a whole cycle. Nothing is dispatched."""
    n = slots or int((job.spec.get("resources") or {}).get("cpu_slots") or 1)
    gpus = tuple(g.uuid for g in host.gpus)[: job.gpus] if job.gpus else ()
    entry = PlacementEntry(host=host.name, queue=host.queue, gpus=gpus, slots=len(gpus) or n, node_rank=0)
    applied = apply_all(db=db, decisions=Decisions(admissions=(Admission(job.id, (entry,)),)), now=utcnow())
    assert applied.admitted == [job.id], f"job {job.id} was not admitted (state {job.state})"
    attempt = db.scalars(
        select(Attempt).where(Attempt.job_id == job.id, Attempt.fencing_token == job.fencing_token)
    ).one()
    return attempt


class SchedulerThread:
    """The real scheduler: ``scheduler.live.loop.run_cycle`` every ``interval_s`` (what ``python -m scheduler`` runs
    once it leads, minus the leader election, which a test with one scheduler does not need).

    A cycle that fails on a database error is retried at the next tick, as the live loop does (tests restart
    PostgreSQL); any other error stops the thread and ``stop()`` raises it, so a broken cycle fails the test."""

    def __init__(
        self,
        maker: Callable[[], Session],
        settings: Settings,
        *,
        interval_s: float = 0.5,
        config: PolicyConfig | None = None,
    ):
        self.maker = maker
        self.config = config
        self.settings = settings
        self.interval_s = interval_s
        self.database_errors = 0
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def cycle(self) -> CycleResult:
        return run_cycle(
            session_factory=self.maker, dispatch=dispatch_attempt, settings=self.settings, config=self.config
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except DBAPIError as exc:  # the database is restarting: the next cycle tries again
                self.database_errors += 1
                log.warning("scheduling cycle failed: %s", exc)
            except Exception as exc:
                self.failure = exc
                log.exception("scheduling cycle failed")
                return
            self._stop.wait(self.interval_s)

    def start(self) -> SchedulerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.failure is not None:
            raise AssertionError(f"the scheduler thread failed: {self.failure!r}") from self.failure
