"""The events deliverer's durable cursor: how far it has turned events into webhook deliveries (``core.outbox``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, utcnow


class EventCursor(Base):
    """One row per reader of the events table (``webhooks``). Every event up to ``last_event_id`` has been read,
    but for the ids in ``gaps``: ids below it no reader saw, taken by a transaction that had not committed yet (it
    may still) or that rolled back. ``horizon_xid`` (PostgreSQL): once every transaction older than it has ended,
    the gaps up to ``horizon_event_id`` can no longer fill and are dropped."""

    __tablename__ = "event_cursors"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger, default=0)
    gaps: Mapped[list[Any]] = mapped_column(default=list, comment="event ids at or below last_event_id not seen yet")
    horizon_xid: Mapped[int | None] = mapped_column(BigInteger, comment="pg_snapshot_xmax when the gaps were seen")
    horizon_event_id: Mapped[int | None] = mapped_column(BigInteger, comment="the gaps up to it wait for horizon_xid")
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
