"""The events deliverer (``core.outbox``) against real PostgreSQL: a crash between reading events and recording
the cursor neither loses nor repeats a delivery, an event committed after a later one is still delivered, an id
rolled back stops being waited for, and two deliverers never read at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine
from core.event_types import EventType
from core.migrate import upgrade
from core.models import EventCursor, Job, QosClass, Team, Webhook, WebhookDelivery
from core.outbox import WEBHOOKS, deliver_events
from core.states import JobState
from core.transitions import transition
from harness.services import temporary_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def factory() -> Iterator[sessionmaker[Session]]:
    """A database of its own: the deliverer commits."""
    with temporary_database("kiln_outbox") as url:
        upgrade(url)
        engine = make_engine(url)
        yield sessionmaker(bind=engine, expire_on_commit=False)
        engine.dispose()


def _hook_and_jobs(factory: sessionmaker[Session], n: int) -> tuple[int, list[int]]:
    """A team with a hook on ``failed`` and ``n`` running jobs (nothing ended yet)."""
    with factory() as db:
        team = Team(name=f"o{time.monotonic_ns()}")
        db.add(team)
        db.flush()
        hook = Webhook(team_id=team.id, url="http://127.0.0.1:9/k", secret="whsec_test", events=["failed"])
        qos = db.scalars(select(QosClass)).first()
        assert qos is not None
        jobs = [
            Job(name=f"j{i}", team_id=team.id, spec={}, qos_class_id=qos.id, state=JobState.RUNNING.value)
            for i in range(n)
        ]
        db.add_all([hook, *jobs])
        db.commit()
        return hook.id, [j.id for j in jobs]


def _fail(db: Session, job_id: int) -> int:
    job = db.get(Job, job_id)
    assert job is not None
    event = transition(db, job, JobState.FAILED, message=f"job {job_id} failed")
    db.flush()
    return event.id


def _pass(factory: sessionmaker[Session]) -> int:
    with factory() as db:
        done = deliver_events(db)
        db.commit()
        return done.deliveries


def _delivered(factory: sessionmaker[Session], hook_id: int) -> list[tuple[int | None, str]]:
    with factory() as db:
        rows = db.execute(
            select(WebhookDelivery.event_id, WebhookDelivery.kind)
            .where(WebhookDelivery.webhook_id == hook_id)
            .order_by(WebhookDelivery.id)
        )
        return [(event_id, kind) for event_id, kind in rows]


def _cursor(factory: sessionmaker[Session]) -> EventCursor:
    with factory() as db:
        cursor = db.get(EventCursor, WEBHOOKS)
        assert cursor is not None
        return cursor


def test_a_crash_before_the_cursor_is_recorded_loses_and_repeats_nothing(factory: sessionmaker[Session]) -> None:
    hook_id, (job_id,) = _hook_and_jobs(factory, 1)
    with factory() as db:
        event_id = _fail(db, job_id)
        db.commit()
    crashed = factory()
    assert deliver_events(crashed).deliveries == 1  # read, delivery written, cursor moved: none of it committed
    pid = crashed.scalar(text("SELECT pg_backend_pid()"))
    with factory() as killer:  # the deliverer's process dies: the server ends its session and rolls it back
        killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    crashed.invalidate()
    crashed.close()
    assert _delivered(factory, hook_id) == []
    assert _pass(factory) == 1
    assert _pass(factory) == 0
    assert _delivered(factory, hook_id) == [(event_id, "failed")]


def test_reading_events_again_writes_no_delivery_twice(factory: sessionmaker[Session]) -> None:
    """A cursor moved back (its write lost, a restore) reads events it read before: one delivery each still."""
    hook_id, jobs = _hook_and_jobs(factory, 2)
    with factory() as db:
        events = [_fail(db, job_id) for job_id in jobs]
        db.commit()
    assert _pass(factory) == 2
    with factory() as db:
        cursor = db.get(EventCursor, WEBHOOKS, with_for_update=True)
        assert cursor is not None
        cursor.last_event_id = events[0] - 1
        db.commit()
    assert _pass(factory) == 0
    assert _delivered(factory, hook_id) == [(e, "failed") for e in events]
    with factory() as db:  # and the table itself refuses a second one
        db.add(WebhookDelivery(webhook_id=hook_id, event_id=events[0], kind="failed", payload={}))
        with pytest.raises(IntegrityError):
            db.flush()


def test_an_event_committed_after_a_later_one_is_delivered(factory: sessionmaker[Session]) -> None:
    """Ids are taken in one order and committed in another: the earlier id, not seen when the later one was read,
    is read once it commits."""
    hook_id, jobs = _hook_and_jobs(factory, 2)
    slow, fast = factory(), factory()
    early = _fail(slow, jobs[0])
    late = _fail(fast, jobs[1])
    assert early < late
    fast.commit()
    assert _pass(factory) == 1
    assert _cursor(factory).last_event_id >= late and [early, early] in _cursor(factory).gaps
    slow.commit()
    assert _pass(factory) == 1
    assert _pass(factory) == 0
    assert sorted(_delivered(factory, hook_id)) == [(early, "failed"), (late, "failed")]
    slow.close()
    fast.close()


def test_a_rolled_back_id_is_waited_for_until_no_transaction_can_commit_it(factory: sessionmaker[Session]) -> None:
    hook_id, jobs = _hook_and_jobs(factory, 2)
    slow, fast = factory(), factory()
    lost = _fail(slow, jobs[0])
    kept = _fail(fast, jobs[1])
    fast.commit()
    _pass(factory)
    assert _cursor(factory).horizon_xid is not None and [lost, lost] in _cursor(factory).gaps
    _pass(factory)
    assert [lost, lost] in _cursor(factory).gaps  # its transaction is still running: it may yet commit
    slow.rollback()
    slow.close()
    fast.close()
    for _ in range(2):  # a horizon set for an earlier gap is passed first, then this gap's own
        _wait_past_the_horizon(factory)
        _pass(factory)
    assert _cursor(factory).gaps == [] and _cursor(factory).horizon_xid is None
    assert _delivered(factory, hook_id) == [(kept, "failed")]


def _wait_past_the_horizon(factory: sessionmaker[Session]) -> None:
    """Until every transaction of the cluster running when the cursor's gaps were found has ended (other databases'
    too: PostgreSQL's snapshot counts them all)."""
    horizon = _cursor(factory).horizon_xid
    with factory() as db:
        deadline = time.monotonic() + 300
        while horizon is not None and db.scalar(text(XMIN)) < horizon:
            assert time.monotonic() < deadline, "a transaction elsewhere stayed open for 5 minutes"
            db.rollback()
            time.sleep(0.2)


XMIN = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"


def test_two_deliverers_never_read_at_once(factory: sessionmaker[Session]) -> None:
    hook_id, (job_id,) = _hook_and_jobs(factory, 1)
    with factory() as db:
        event_id = _fail(db, job_id)
        db.commit()
    with factory() as one, factory() as other:
        assert deliver_events(one).deliveries == 1
        assert deliver_events(other).read == 0  # the cursor is held: this one skips the pass
        one.commit()
    assert _delivered(factory, hook_id) == [(event_id, "failed")]


def test_events_no_hook_hears_are_passed_over(factory: sessionmaker[Session]) -> None:
    """Audit and timeline events (no job, or a type no hook hears) are read and write nothing."""
    hook_id, (job_id,) = _hook_and_jobs(factory, 1)
    from core.transitions import record_event

    with factory() as db:
        job = db.get(Job, job_id)
        record_event(db, EventType.CHECKPOINT, job=job, message="step 10")
        record_event(db, EventType.TEAM_UPDATED, team_id=job.team_id if job else None, message="renamed")
        db.commit()
    assert _pass(factory) == 0
    assert _delivered(factory, hook_id) == []


def test_the_embedded_sqlite_database_delivers_too(tmp_path: Path) -> None:
    """SQLite (the embedded default) commits one writer at a time in id order: no gaps are kept."""
    url = f"sqlite:///{tmp_path}/kiln.db"
    upgrade(url)
    engine = make_engine(url)
    sqlite = sessionmaker(bind=engine, expire_on_commit=False)
    try:
        hook_id, jobs = _hook_and_jobs(sqlite, 2)
        with sqlite() as db:
            events = [_fail(db, job_id) for job_id in jobs]
            db.commit()
        assert _pass(sqlite) == 2
        assert _pass(sqlite) == 0
        assert _delivered(sqlite, hook_id) == [(e, "failed") for e in events]
        assert _cursor(sqlite).last_event_id == events[-1] and _cursor(sqlite).gaps == []
    finally:
        engine.dispose()
