"""Wake the scheduler: ``NOTIFY kiln_jobs`` inside the caller's transaction (delivered when it commits).

Job submission and cancellation call ``notify_jobs_changed(db)``; on SQLite it does nothing (the embedded
scheduler runs on its timer).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

CHANNEL = "kiln_jobs"


def notify_jobs_changed(db: Session, payload: str = "") -> None:
    if db.get_bind().dialect.name != "postgresql":
        return
    db.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload[:7000]})
