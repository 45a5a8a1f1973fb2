"""Leadership: one scheduler decides at a time, and a leader that stops renewing stops leading.

PostgreSQL: a lease with a term, one row of ``scheduler_lease`` on the database's clock. A standby takes the row
only once it expired (``try_acquire``), raising the term; the leader renews it at the start of every cycle's
transaction (``hold``), which also locks the row until that transaction ends, so no takeover can slip between the
check and the commit, and a stale leader's late cycle finds another term and is refused. A leader whose last
renewal is older than the lease by its own clock steps down without asking (a process frozen for minutes wakes up
knowing it is stale); a leader frozen inside a transaction is ended by the server's idle-in-transaction timeout,
which the scheduler's engine sets under half a lease. The first renewal after a gap of more than half a lease (the
database or every scheduler was away) moves ``watched_since``, which the reconciler's grace counts from.

The acquiring connection also LISTENs on ``kiln_jobs`` so that a submit wakes the leader without waiting for the
timer. SQLite (the embedded default, one scheduler on one host): an exclusive ``flock`` on a file beside the
database.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Protocol

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core.notify import CHANNEL, wake_file

log = logging.getLogger(__name__)

LOCK_KEY = 0x6B696C6E  # "kiln": the cycle's transaction lock is LOCK_KEY + 1, the dependencies' + 2


class LeadershipLost(RuntimeError):
    """This process is not the leader any more: it stops acting and campaigns again."""


@dataclass(frozen=True)
class Term:
    """What a renewal tells the cycle: its term, since when leaders watched without a gap, and the gap this renewal
    closed (None: there was none)."""

    number: int
    watched_since: datetime
    unwatched_s: float | None = None


class Leadership(Protocol):
    def try_acquire(self) -> bool: ...
    def hold(self, db: Session) -> Term | None:
        """In the caller's transaction: check this process still leads and renew its lease till that transaction
        ends; raises ``LeadershipLost`` otherwise. None where leadership has no term (SQLite's file lock)."""
        ...

    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        """Block up to ``timeout_s`` for a wake-up (or ``stop``); True if one came. Raises if leadership was lost."""
        ...

    def release(self) -> None: ...


def psycopg_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# The previous renewal is read from the statement's snapshot (``old``) to measure the gap this one closes.
_ACQUIRE = """
WITH old AS (SELECT renewed_at FROM scheduler_lease WHERE id = 1)
INSERT INTO scheduler_lease AS l (id, holder, term, renewed_at, expires_at, watched_since)
VALUES (1, %(holder)s, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => %(lease)s), clock_timestamp())
ON CONFLICT (id) DO UPDATE SET
    holder = EXCLUDED.holder,
    term = l.term + 1,
    watched_since = CASE WHEN clock_timestamp() - l.renewed_at > make_interval(secs => %(gap)s)
                         THEN clock_timestamp() ELSE l.watched_since END,
    renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE l.expires_at < clock_timestamp() OR l.holder = EXCLUDED.holder
RETURNING l.term, l.watched_since, EXTRACT(EPOCH FROM clock_timestamp() - (SELECT renewed_at FROM old))
"""

_RENEW = text("""
WITH old AS (SELECT renewed_at FROM scheduler_lease WHERE id = 1)
UPDATE scheduler_lease SET
    watched_since = CASE WHEN clock_timestamp() - renewed_at > make_interval(secs => :gap)
                         THEN clock_timestamp() ELSE watched_since END,
    renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + make_interval(secs => :lease)
WHERE id = 1 AND term = :term AND holder = :holder AND expires_at > clock_timestamp()
RETURNING watched_since, EXTRACT(EPOCH FROM clock_timestamp() - (SELECT renewed_at FROM old))
""")


class PostgresLeadership:
    def __init__(self, url: str, *, lease_s: float) -> None:
        self.conninfo = psycopg_conninfo(url)
        self.lease_s = lease_s
        self.gap_s = lease_s / 2  # renewals come every cycle, at least every scheduler_interval_s
        self.holder = f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.term: int | None = None
        self.valid_until = 0.0  # monotonic: the lease as this process last renewed it
        self.unwatched_s: float | None = None  # a gap the takeover closed, for the first cycle to report

    def try_acquire(self) -> bool:
        try:
            if self.conn is None or self.conn.closed:
                # A lease row locked by the leader's cycle is being renewed: try again later rather than queue.
                self.conn = psycopg.connect(
                    self.conninfo, autocommit=True, connect_timeout=5, options="-c lock_timeout=1000"
                )
            sent = time.monotonic()
            params = {"holder": self.holder, "lease": self.lease_s, "gap": self.gap_s}
            row = self.conn.execute(_ACQUIRE, params).fetchone()
            if row is None:
                return False
            self.conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as e:
            if not isinstance(e, psycopg.errors.LockNotAvailable):
                log.exception("leader election: database unreachable")
            self.release()
            return False
        self.term, self.valid_until = int(row[0]), sent + self.lease_s  # type: ignore[call-overload]
        gap = float(row[2]) if row[2] is not None else None  # type: ignore[arg-type]
        self.unwatched_s = gap if gap is not None and gap > self.gap_s else None
        return True

    def hold(self, db: Session) -> Term:
        sent = time.monotonic()
        if self.term is None or sent > self.valid_until:
            raise LeadershipLost(f"no renewal of term {self.term} within the {self.lease_s:.0f} s lease")
        params = {"term": self.term, "holder": self.holder, "lease": self.lease_s, "gap": self.gap_s}
        row = db.execute(_RENEW, params).first()
        if row is None:
            self.valid_until = 0.0
            raise LeadershipLost(f"term {self.term} is over: another scheduler leads, or the lease expired")
        self.valid_until = sent + self.lease_s
        gap = float(row[1]) if row[1] is not None else None
        unwatched = self.unwatched_s if gap is None or gap <= self.gap_s else gap
        self.unwatched_s = None
        return Term(self.term, row[0], unwatched)

    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        if self.conn is None:
            raise LeadershipLost("not the leader")
        if time.monotonic() > self.valid_until:  # a frozen leader wakes up here: it is stale, whatever the row says
            raise LeadershipLost(f"no renewal of term {self.term} within the {self.lease_s:.0f} s lease")
        woke = False
        # Back by half a lease before it ends, whatever the interval: the next cycle renews it.
        deadline = min(time.monotonic() + timeout_s, self.valid_until - self.lease_s / 2)
        while not woke and not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            for _n in self.conn.notifies(timeout=min(left, 0.5), stop_after=1):
                woke = True
        if woke:  # drain a burst of notifications: one cycle serves them all
            for _n in self.conn.notifies(timeout=0.05):
                pass
        return woke

    def release(self) -> None:
        """Give the lease back (a standby takes over at its next try, not after the lease) and close."""
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                if self.term is not None and not self.conn.closed:
                    self.conn.execute(
                        "UPDATE scheduler_lease SET expires_at = clock_timestamp() WHERE id = 1 AND term = %s"
                        " AND holder = %s",
                        (self.term, self.holder),
                    )
                self.conn.close()
        self.conn, self.term, self.valid_until = None, None, 0.0


class FileLeadership:
    """One scheduler per embedded (SQLite) deployment: an exclusive lock on a file. It is woken by the database's
    wake file (``core.notify``), whose time stamp it checks every ``WAKE_POLL_S``."""

    WAKE_POLL_S = 0.1

    def __init__(self, path: Path, wake: Path | None = None) -> None:
        self.path = path
        self.wake = wake
        self.fh: IO[str] | None = None
        self.woken_at = self._stamp()

    def _stamp(self) -> int | None:
        try:
            return os.stat(self.wake).st_mtime_ns if self.wake is not None else None
        except OSError:
            return None

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

    def hold(self, db: Session) -> None:
        if self.fh is None:
            raise LeadershipLost("not the leader")

    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        deadline = time.monotonic() + timeout_s
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            stamp = self._stamp()
            if stamp != self.woken_at:
                self.woken_at = stamp
                return True
            stop.wait(min(left, self.WAKE_POLL_S))
        return False

    def release(self) -> None:
        if self.fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
            self.fh.close()
        self.fh = None


def leadership_for(url: str, home: Path, *, lease_s: float) -> Leadership:
    if url.startswith("postgresql"):
        return PostgresLeadership(url, lease_s=lease_s)
    return FileLeadership(home / "scheduler.lock", wake_file(make_url(url)))
