"""Leader election between two live loops on PostgreSQL (advisory lock), NOTIFY wake-ups, and SQLite's file lock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.db import Base, make_engine, utcnow
from core.migrate import upgrade
from core.models import Attempt, Job
from core.notify import notify_jobs_changed
from core.settings import Settings
from scheduler.live.leader import LOCK_KEY, FileLeadership, psycopg_conninfo
from scheduler.live.loop import run_cycle
from tests.integration import test_scheduler_support as f
from tests.support.scheduler_loop import LoopThread
from tests.support.services import temporary_database

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    with temporary_database("kiln_sched") as url:
        upgrade(url)
        yield url


SENT: list[int] = []  # the attempts the loops dispatched (no broker in these tests)


def record_dispatch(attempt_id: int, token: int, placement: list[Any]) -> None:
    SENT.append(attempt_id)


@pytest.fixture
def no_dispatch() -> Iterator[list[int]]:
    SENT.clear()
    yield SENT
    SENT.clear()


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def leader_pid(url: str) -> int | None:
    with psycopg.connect(psycopg_conninfo(url)) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted", (LOCK_KEY,)
        ).fetchone()
        return int(row[0]) if row else None


def submit(factory: sessionmaker[Session], name: str, *, with_host: bool = False) -> int:
    with factory() as db:
        now = utcnow()
        t = db.scalars(select(f.Team).where(f.Team.name == "lead")).first() or f.team(db, "lead")
        if with_host:
            f.host(db, "l1", 8, now=now + timedelta(days=1))  # a heartbeat far ahead: never stale in this test
        j = f.job(db, t, f.qos(db, "silver"), gpus=1, name=name, submitted_at=now)
        notify_jobs_changed(db)
        db.commit()
        return j.id


def test_two_loops_one_leader_and_failover(fresh_pg: str, no_dispatch: list[int], tmp_path: Path) -> None:
    settings = Settings(database_url=fresh_pg, home=tmp_path, scheduler_interval_s=30.0)
    engine = make_engine(fresh_pg)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    a = LoopThread(settings, record_dispatch)
    assert wait_for(lambda: leader_pid(fresh_pg) is not None)
    first_leader = leader_pid(fresh_pg)
    b = LoopThread(settings, record_dispatch)
    try:
        time.sleep(0.5)
        assert leader_pid(fresh_pg) == first_leader  # the standby did not take the lock
        j1 = submit(factory, "one", with_host=True)

        def admitted(job_id: int) -> bool:
            with factory() as db:
                job = db.get(Job, job_id)
                return job is not None and job.state == "ADMITTED"

        # Woken by NOTIFY, long before the 30 s timer.
        assert wait_for(lambda: admitted(j1), timeout=10)
        assert a.halt()  # the leader goes away; its connection closes and the lock with it
        assert wait_for(lambda: leader_pid(fresh_pg) not in (None, first_leader), timeout=40)
        j2 = submit(factory, "two")
        assert wait_for(lambda: admitted(j2), timeout=10)
        with factory() as db:
            counts = dict(db.execute(select(Attempt.job_id, func.count()).group_by(Attempt.job_id)).tuples().all())
        assert counts == {j1: 1, j2: 1}  # exactly one attempt each: never admitted twice
    finally:
        a.stop.set()
        assert b.halt()
        engine.dispose()


def test_run_cycle_on_sqlite(tmp_path: Path, no_dispatch: list[int]) -> None:
    url = f"sqlite:///{tmp_path / 'kiln.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    now = datetime.now(UTC)
    with factory() as db:
        t = f.team(db, "local")
        host = f.host(db, "laptop", 0, now=now, cpu_slots=4)
        ids = [f.job(db, t, f.qos(db, "silver"), gpus=0, name=f"cpu{i}", submitted_at=now).id for i in range(5)]
        db.commit()
        host_name = host.name
    result: Any = run_cycle(session_factory=factory, dispatch=record_dispatch, now=now + timedelta(seconds=1))
    assert result.admitted == ids[:4]  # four CPU slots, one each
    assert len(no_dispatch) == 4
    with factory() as db:
        attempt = db.scalars(select(Attempt).where(Attempt.job_id == ids[0])).one()
        expected = {"host": host_name, "queue": "host.laptop", "gpus": [], "slots": 1, "node_rank": 0}
        assert attempt.placement == [expected]
        waiting = db.get(Job, ids[4])
        assert waiting is not None and waiting.pending_reason in ("Resources", "Reservation")
    engine.dispose()


def test_file_leadership_is_exclusive(tmp_path: Path) -> None:
    one, two = FileLeadership(tmp_path / "s.lock"), FileLeadership(tmp_path / "s.lock")
    assert one.try_acquire()
    assert not two.try_acquire()
    one.release()
    assert two.try_acquire()
    two.release()
