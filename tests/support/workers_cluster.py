"""Several real worker processes (``python -m workers``) acting as hosts, for the failover and worker tests."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil
from sqlalchemy.orm import Session, sessionmaker

from core import db as core_db
from core.db import make_engine
from core.migrate import upgrade
from core.settings import Settings, get_settings
from workers import celery_app

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# The main job, slowed down so that a test can act mid-run (the trainer's own test hook), and fast to restart.
def tiny_spec(name: str, *, steps: int = 60, every_steps: int = 10, sleep_s: float = 0.15, **hp: Any) -> dict[str, Any]:
    return {
        "name": name, "team": "default", "steps": steps, "seed": 1234,
        "recipe": {"name": "gpt", "hyperparameters": {
            "size": "tiny", "corpus": "stdlib", "batch_size": 8, "seq_len": 128, "lr": 0.003,
            "test_sleep_per_step_s": sleep_s, "heartbeat_s": 0.5, **hp}},
        "resources": {"gpus": 0, "cpu_slots": 1}, "parallelism": "ddp", "compile": {"mode": "off"},
        "precision": "fp32", "checkpointing": {"every_steps": every_steps, "keep_last": 3, "asynchronous": False},
        "sla": {"qos": "silver"},
    }  # fmt: skip


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # the database may be restarting: keep looking
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Cluster:
    """Environment shared by the test process and its workers; the test process uses the same settings."""

    def __init__(self, tmp: Path, *, database_url: str, broker_url: str, lease_s: float = 8.0,
                 heartbeat_s: float = 1.0, visibility_timeout_s: float | None = None):  # fmt: skip
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
            "PYTHONPATH": str(ROOT),
        }
        if visibility_timeout_s is not None:
            self.env[celery_app.ENV_VISIBILITY_TIMEOUT] = str(visibility_timeout_s)
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self._saved: dict[str, str | None] = {}

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
        with contextlib.suppress(Exception):
            core_db.get_engine().dispose()
        get_settings.cache_clear()
        core_db.get_engine.cache_clear()
        core_db.get_sessionmaker.cache_clear()
        celery_app.get_app.cache_clear()

    def sessionmaker(self) -> sessionmaker[Session]:
        return core_db.get_sessionmaker()

    def start_worker(self, label: str, *, cpu_slots: int = 1) -> str:
        name = self.host(label)
        log = self.tmp / f"worker-{label}.log"
        self.logs[name] = log
        self.workers[name] = subprocess.Popen(
            [sys.executable, "-m", "workers", "--host", name, "--cpu-slots", str(cpu_slots), "--address", "127.0.0.1"],
            env=self.env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True,
        )
        return name

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL the worker and every process under it (torchrun, the ranks), all at once."""
        proc = self.workers[name]
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        killed = [proc.pid]
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
                killed.append(p.pid)
        proc.wait(10)
        return killed

    def trainer_pids(self, name: str) -> list[int]:
        proc = self.workers[name]
        try:
            return [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop_all(self) -> None:
        for _name, proc in list(self.workers.items()):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for name, proc in list(self.workers.items()):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill_worker(name)
            # Anything the worker left behind (it should have stopped its trainers).
        for proc in self.workers.values():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()

    def log_text(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""


@contextmanager
def cluster(tmp: Path, *, database_url: str, broker_url: str, **kw: Any) -> Iterator[Cluster]:
    upgrade(database_url) if database_url.startswith("postgresql") else None
    c = Cluster(tmp, database_url=database_url, broker_url=broker_url, **kw)
    c.activate()
    if not database_url.startswith("postgresql"):
        upgrade(database_url)
    try:
        yield c
    finally:
        c.stop_all()
        c.deactivate()


def engine_for(url: str) -> Any:
    return make_engine(url)
