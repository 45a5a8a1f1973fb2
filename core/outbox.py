"""The events deliverer: reads the events written after its durable cursor and turns them into webhook deliveries.

The state machine (``core.transitions``) writes events only. This pass, run by the webhook notifier before each of
its rounds (``scheduler.live.notifier``), reads the events after the cursor and writes their deliveries
(``core.webhooks.enqueue_for_event``: the hooks that hear them, a sweep's ``sweep_finished`` with its ranking), then
moves the cursor, all in the caller's transaction: a crash before the commit loses both, and the next pass reads
the same events again. Reading an event twice writes nothing twice (one delivery per hook, event and kind).

Ids are taken in one order and committed in another: on PostgreSQL an event can become visible after one with a
higher id was read. The cursor keeps the ids it passed without seeing them (``gaps``) and reads them again on every
pass, until every transaction that was running when they were found has ended (``pg_current_snapshot``): an id
still missing then was rolled back. (The one case this misses: a transaction that took its id and, for the whole
time between two passes, has not written its row yet; the insert does both in one statement.) SQLite commits one
writer at a time in the order it takes ids, so there are no gaps to wait for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, or_, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Event, EventCursor
from core.webhooks import enqueue_for_event, may_notify

WEBHOOKS = "webhooks"  # the cursor's name
BATCH = 500  # events read in one pass: a backlog is worked off in several, each a short transaction

Gap = tuple[int, int]  # ids lo..hi (both included) passed unseen


@dataclass(frozen=True)
class Pass:
    """What one pass did: events read (new and late ones), deliveries written, whether more new ones wait."""

    read: int
    deliveries: int
    more: bool


def deliver_events(db: Session, *, batch: int = BATCH) -> Pass:
    """One pass in the caller's transaction (it commits). Does nothing while another deliverer holds the cursor."""
    cursor = _lock_cursor(db)
    if cursor is None:
        return Pass(0, 0, more=False)
    postgres = db.get_bind().dialect.name == "postgresql"
    # Taken before the reads: every transaction older than it has ended, so its events are among what they see.
    oldest_running = _snapshot(db, "xmin") if postgres else 0
    gaps: list[Gap] = [(int(lo), int(hi)) for lo, hi in cursor.gaps or []]
    # Ids and types first: most events (checkpoints, evaluations, audit) no hook hears, and are not loaded.
    late = list(db.execute(select(Event.id, Event.type).where(_within(gaps)))) if gaps else []
    fresh = list(
        db.execute(select(Event.id, Event.type).where(Event.id > cursor.last_event_id).order_by(Event.id).limit(batch))
    )
    heard = [event_id for event_id, type_ in [*late, *fresh] if may_notify(type_)]
    events = list(db.scalars(select(Event).where(Event.id.in_(heard)).order_by(Event.id))) if heard else []
    written = sum(len(enqueue_for_event(db, event)) for event in events)
    gaps = _without(gaps, [event_id for event_id, _ in late])
    if fresh:
        gaps += _missing(cursor.last_event_id + 1, [event_id for event_id, _ in fresh])
        cursor.last_event_id = fresh[-1][0]
    if postgres:
        _settle(db, cursor, gaps, oldest_running)
    else:
        cursor.gaps = []  # nothing is in flight below what SQLite's readers see
    cursor.updated_at = utcnow()
    return Pass(len(late) + len(fresh), written, more=len(fresh) == batch)


def _lock_cursor(db: Session) -> EventCursor | None:
    """The cursor's row, locked for this transaction on PostgreSQL; None while another deliverer holds it. A
    database made without the migrations (``create_all``) gets its row here, from the first event on."""
    stmt = select(EventCursor).where(EventCursor.name == WEBHOOKS)
    if db.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    cursor = db.scalars(stmt).first()
    if cursor is not None or db.scalar(select(EventCursor.name).where(EventCursor.name == WEBHOOKS)) is not None:
        return cursor
    try:
        with db.begin_nested():
            db.add(EventCursor(name=WEBHOOKS, last_event_id=0, gaps=[], updated_at=utcnow()))
    except IntegrityError:  # made meanwhile by another deliverer, which may hold it
        pass
    return db.scalars(stmt).first()


def _snapshot(db: Session, bound: str) -> int:
    """``xmin`` (the oldest transaction still running) or ``xmax`` (the next to begin) of PostgreSQL's snapshot."""
    return int(db.scalar(text(f"SELECT pg_snapshot_{bound}(pg_current_snapshot())::text::bigint")) or 0)


def _settle(db: Session, cursor: EventCursor, gaps: list[Gap], oldest_running: int) -> None:
    """Drop the gaps that can no longer fill, and give the others a horizon to wait for."""
    if cursor.horizon_xid is not None and oldest_running >= cursor.horizon_xid:
        # Every transaction running when these gaps were found has ended: what is still missing was rolled back.
        bound = cursor.horizon_event_id or 0
        gaps = [(max(lo, bound + 1), hi) for lo, hi in gaps if hi > bound]
        cursor.horizon_xid = cursor.horizon_event_id = None
    if not gaps:
        cursor.horizon_xid = cursor.horizon_event_id = None
    elif cursor.horizon_xid is None:
        # Taken after the reads: a transaction that took a missing id had begun by then.
        cursor.horizon_xid = _snapshot(db, "xmax")
        cursor.horizon_event_id = cursor.last_event_id
    cursor.gaps = [[lo, hi] for lo, hi in gaps]


def _within(gaps: Sequence[Gap]) -> ColumnElement[bool]:
    return or_(*(Event.id.between(lo, hi) for lo, hi in gaps))


def _missing(first: int, seen: Sequence[int]) -> list[Gap]:
    """The ids from ``first`` up to the last of ``seen`` (ascending) that are not in it, as ranges."""
    out, expected = [], first
    for event_id in seen:
        if event_id > expected:
            out.append((expected, event_id - 1))
        expected = event_id + 1
    return out


def _without(gaps: Sequence[Gap], found: Sequence[int]) -> list[Gap]:
    """``gaps`` less the ids ``found`` in them (each found id splits its range)."""
    out = []
    for lo, hi in gaps:
        inside = sorted(i for i in found if lo <= i <= hi)
        out += _missing(lo, [*inside, hi + 1]) if inside else [(lo, hi)]
    return out
