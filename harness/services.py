"""Real PostgreSQL and Redis for the tests: each run creates (and drops) its own databases. And the servers a test
starts itself: a free port, and waiting until one answers."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import psycopg

from harness.deps import missing

PG_ADMIN_URL = os.environ.get("KILN_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL_BASE = os.environ.get("KILN_TEST_REDIS", "redis://127.0.0.1:6379")


def sqlalchemy_url(dbname: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{dbname}"


def postgres_available() -> bool:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def require_postgres() -> None:
    if not postgres_available():
        missing(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")


@contextmanager
def temporary_database(prefix: str = "kiln_test") -> Iterator[str]:
    """Create a fresh database, yield its SQLAlchemy URL, drop it afterwards (only ours)."""
    require_postgres()
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield sqlalchemy_url(name)
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def redis_url(db: int | None = None) -> str:
    """A Redis database index for this run; tests prefix their keys, so sharing an index is harmless."""
    import redis

    client = redis.Redis.from_url(REDIS_URL_BASE, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        missing(f"Redis is not reachable at {REDIS_URL_BASE}")
    index = db if db is not None else 1 + os.getpid() % 15
    return f"{REDIS_URL_BASE}/{index}"


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_serving(url: str, proc: subprocess.Popen[bytes], *, timeout: float, log: Path) -> None:
    """Poll ``GET url`` until it answers 200. Fails, with the end of the server's ``log``, as soon as ``proc`` has
    exited or once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def process_tree(pid: int) -> list[psutil.Process]:
    """The running process ``pid`` (e.g. a detached ``kiln up``, from its lock file) and its descendants, as psutil
    handles: each checks before a signal that its pid was not reused since, which ``os.kill(pid)`` later would
    not (pids wrap around within a CI run, and the pid may be another test's process by then). [] if none runs."""
    try:
        root = psutil.Process(pid) if pid else None
        return [root, *root.children(recursive=True)] if root is not None else []
    except psutil.Error:
        return []
