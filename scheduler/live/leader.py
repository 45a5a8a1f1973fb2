"""Leadership: one scheduler decides at a time.

PostgreSQL: ``pg_try_advisory_lock`` on a dedicated autocommit connection; the lock lives as long as that
connection, so a leader that dies (or loses its connection) frees it at once and a standby takes over on its
next try. The same connection LISTENs on ``kiln_jobs`` so that a submit wakes the leader without waiting for
the timer. SQLite (the embedded default): an exclusive ``flock`` on a file beside the database.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO, Protocol

import psycopg
from sqlalchemy.engine import make_url

from core.notify import CHANNEL

log = logging.getLogger(__name__)

LOCK_KEY = 0x6B696C6E  # "kiln"


class Leadership(Protocol):
    def try_acquire(self) -> bool: ...
    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        """Block up to ``timeout_s`` for a wake-up (or ``stop``); True if one came. Raises if leadership was lost."""
        ...

    def release(self) -> None: ...


def psycopg_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PostgresLeadership:
    def __init__(self, url: str) -> None:
        self.conninfo = psycopg_conninfo(url)
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None

    def try_acquire(self) -> bool:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
            row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
            if row is None or not row[0]:
                return False
            self.conn.execute(f"LISTEN {CHANNEL}")
            return True
        except psycopg.Error:
            log.exception("leader election: database unreachable")
            self.release()
            return False

    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        if self.conn is None:
            raise RuntimeError("not the leader")
        woke = False
        deadline = time.monotonic() + timeout_s
        while not woke and not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            for _n in self.conn.notifies(timeout=min(left, 0.5), stop_after=1):
                woke = True
        if woke:  # drain a burst of notifications: one cycle serves them all
            for _n in self.conn.notifies(timeout=0.05):
                pass
        # A dead connection would have raised above; a cheap query proves the lock's session is still alive.
        self.conn.execute("SELECT 1")
        return woke

    def release(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()  # closing the session releases the advisory lock
        self.conn = None


class FileLeadership:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[str] | None = None

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held for the leader's lifetime
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return False
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self.fh = fh
        return True

    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        stop.wait(timeout_s)
        return False

    def release(self) -> None:
        if self.fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
            self.fh.close()
        self.fh = None


def leadership_for(url: str, home: Path) -> Leadership:
    if url.startswith("postgresql"):
        return PostgresLeadership(url)
    return FileLeadership(home / "scheduler.lock")
