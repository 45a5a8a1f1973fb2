"""The trainer's compile events, read for the compile cache's reuse (core/services/compile_cache.py).

The relay writes every rank's events; rank 0's speak for the attempt (every rank compiles the same graph with the
same cache, and rank 0 is the one that publishes), so the aggregates read rank 0's only. Portable to SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, case, func, or_, select, true
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Event, Job, Team

COMPILE_OK = EventType.COMPILE_OK
REJECTED = EventType.COMPILE_CACHE_REJECTED
PUBLISHED = EventType.COMPILE_CACHE_PUBLISHED
# Older trainers' word for an entry that would not load (a rejection, in today's words).
INVALID = EventType.COMPILE_CACHE_INVALID
COMPILE_EVENT_TYPES = (COMPILE_OK, REJECTED, PUBLISHED, INVALID)
FALLBACK_PREFIX = "FALLBACK_"  # a compile that fell back to eager (FALLBACK_COMPILE_TIMEOUT, ...)


def _rank_zero() -> ColumnElement[bool]:
    return func.coalesce(Event.data["rank"].as_integer(), 0) == 0


def _hit() -> ColumnElement[bool]:
    return Event.data["cache_hit"].as_boolean() == true()


def job_events(db: Session, job_id: int) -> Sequence[Event]:
    """A job's compile events and compile fallbacks, oldest first (the ``ix_events_job_id_id`` index)."""
    stmt = (
        select(Event)
        .where(Event.job_id == job_id, or_(Event.type.in_(COMPILE_EVENT_TYPES), Event.type.like(f"{FALLBACK_PREFIX}%")))
        .order_by(Event.id)
    )
    return db.scalars(stmt).all()


def reuse_by_team(
    db: Session, *, team_ids: Sequence[int] | None, since: datetime, until: datetime
) -> Sequence[tuple[Any, ...]]:
    """(team id, compiles, hits, seconds saved, rejections) per team over rank 0's events in [since, until);
    ``team_ids`` None: every team."""
    is_ok = Event.type == COMPILE_OK
    stmt = (
        select(
            Job.team_id,
            func.sum(case((is_ok, 1), else_=0)),
            func.sum(case((is_ok & _hit(), 1), else_=0)),
            func.sum(case((is_ok, Event.data["saved_s"].as_float()), else_=None)),
            func.sum(case((is_ok, 0), else_=1)),
        )
        .select_from(Event)
        .join(Job, Job.id == Event.job_id)
        .where(
            Event.type.in_((COMPILE_OK, REJECTED, INVALID)),
            Event.created_at >= since,
            Event.created_at < until,
            _rank_zero(),
        )
        .group_by(Job.team_id)
    )
    if team_ids is not None:
        stmt = stmt.where(Job.team_id.in_(team_ids))
    return db.execute(stmt).tuples().all()


def lookup_counts(db: Session) -> Sequence[tuple[Any, ...]]:
    """All-time (team, type, hit, source, count, seconds saved) over rank 0's compile and rejection events, for
    the Prometheus counters: monotonic while those events are kept (core/retention.py keeps them)."""
    source = func.coalesce(Event.data["cache_source"].as_string(), Event.data["source"].as_string())
    hit = case((_hit(), 1), else_=0)
    stmt = (
        select(Team.name, Event.type, hit, source, func.count(), func.sum(Event.data["saved_s"].as_float()))
        .select_from(Event)
        .join(Job, Job.id == Event.job_id)
        .join(Team, Team.id == Job.team_id)
        .where(Event.type.in_((COMPILE_OK, REJECTED, INVALID)), _rank_zero())
        .group_by(Team.name, Event.type, hit, source)
    )
    return db.execute(stmt).tuples().all()
