"""Wake the scheduler when there is work for it: a job submitted, cancelled, lost or ended.

On PostgreSQL: ``NOTIFY kiln_jobs`` inside the caller's transaction (delivered when it commits), which the leader
LISTENs for. On SQLite (the embedded default; no NOTIFY): the database file's *wake file* (``kiln.db.wake``
beside ``kiln.db``) is touched when the caller's transaction commits, and the scheduler watches its time stamp
(``scheduler.live.leader.FileLeadership.wait``). Either way a cycle runs at once instead of at its next tick (2 s):
a killed worker's job is requeued and admitted as soon as the lost attempt is recorded.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

CHANNEL = "kiln_jobs"
_PENDING = "kiln_wake_pending"  # Session.info: a touch is due at this session's next commit


def wake_file(url: URL) -> Path | None:
    """The SQLite database's wake file (None for another database, or one in memory)."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database + ".wake")


def notify_jobs_changed(db: Session, payload: str = "") -> None:
    bind = db.get_bind()
    if bind.dialect.name == "postgresql":
        db.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload[:7000]})
        return
    path = wake_file(bind.engine.url)
    if path is None or db.info.get(_PENDING):
        return
    db.info[_PENDING] = True

    def touch(session: Session) -> None:  # after the commit: the scheduler's cycle reads what it says
        session.info.pop(_PENDING, None)
        with contextlib.suppress(OSError):  # a wake-up missed costs one tick, nothing more
            path.touch()
            os.utime(path)

    event.listen(db, "after_commit", touch, once=True)
