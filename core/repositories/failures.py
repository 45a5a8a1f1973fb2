"""What the checkpoint advice reads: infrastructure failures (LOST), the host-hours they happened in, and a job's
checkpoint costs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Attempt, Event, Usage
from core.states import JobState

CHECKPOINT_EVENTS = (EventType.CHECKPOINT, EventType.CHECKPOINT_LOCAL)


def lost_since(db: Session, since: datetime) -> Sequence[tuple[datetime, dict[str, Any]]]:
    """(when, data) of every LOST transition since ``since``: an attempt ended by an infrastructure failure (its
    data names the attempt and its hosts)."""
    stmt = select(Event.created_at, Event.data).where(Event.type == JobState.LOST.value, Event.created_at >= since)
    return [(at, data or {}) for at, data in db.execute(stmt).tuples()]


def busy_since(db: Session, since: datetime) -> Sequence[tuple[int, str, datetime, datetime | None, list[Any]]]:
    """(attempt id, GPU type, start, end or None, placement) of every attempt's usage that overlaps ``since``."""
    stmt = (
        select(Usage.attempt_id, Usage.gpu_type, Usage.started_at, Usage.ended_at, Attempt.placement)
        .join(Attempt, Attempt.id == Usage.attempt_id)
        .where(or_(Usage.ended_at.is_(None), Usage.ended_at >= since))
    )
    return [(a, t, s, e, p or []) for a, t, s, e, p in db.execute(stmt).tuples()]


def checkpoint_events(db: Session, job_id: int, limit: int = 20) -> Sequence[dict[str, Any]]:
    """The data of the job's newest checkpoint events, newest first."""
    stmt = (
        select(Event.data)
        .where(Event.job_id == job_id, Event.type.in_(CHECKPOINT_EVENTS))
        .order_by(Event.id.desc())
        .limit(limit)
    )
    return [d or {} for d in db.scalars(stmt)]
