"""A PostgreSQL server of a test's own, on a free port, for faults the shared server (5432) must never see:
``pg_ctl stop -m immediate``. Its Redis counterpart is ``harness/redis_server.py``.

PostgreSQL refuses to run as root: where the tests run as root, the cluster belongs to the ``postgres`` user
(``runuser``), as the distribution's own cluster does.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from harness.services import free_port

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def _pg_tool(name: str) -> str:
    for d in PG_BIN_DIRS:
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found (PostgreSQL server binaries)")
    return found


def private_servers_available() -> str | None:
    """None when a private PostgreSQL (and ``redis-server``) can be started here, else why not."""
    try:
        _pg_tool("initdb")
        _pg_tool("pg_ctl")
    except FileNotFoundError as exc:
        return str(exc)
    if shutil.which("redis-server") is None:
        return "redis-server not found"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to own a cluster"
    return None


class PrivatePostgres:
    """A cluster on a free port in a directory of its own under the system's temporary directory (a test's
    ``tmp_path`` is private to root, where the ``postgres`` user cannot reach it); ``stop_immediate`` is a crash
    (no shutdown checkpoint: recovery replays the WAL at the next start), ``start`` brings the same cluster back
    on the same port, ``remove`` stops it and deletes its directory."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
        self.data = self.root / "pgdata"
        self.port = free_port()
        self.log = self.root / "postgres.log"
        self._as_postgres = os.geteuid() == 0

    def _run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout)

    def init(self) -> PrivatePostgres:
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run(
            [
                _pg_tool("initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ]
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            # The socket and the lock file in the test's own directory; fsync off: these faults kill processes,
            # never the machine, so the page cache survives them and the WAL replay sees every commit.
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\nmax_connections = 200\n"
            )
        return self

    def start(self) -> None:
        self._run([_pg_tool("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"])

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: every backend quits at once, nothing is flushed."""
        self._run([_pg_tool("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._run([_pg_tool("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"], timeout=60)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def alive(self) -> bool:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create_database(self, name: str) -> str:
        """A database for kiln; its SQLAlchemy URL."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"
