"""Leader election between two live loops on PostgreSQL (a lease with a term), NOTIFY wake-ups, and SQLite's file
lock."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.db import Base, make_engine, utcnow
from core.migrate import upgrade
from core.models import Attempt, Event, Job
from core.notify import notify_jobs_changed
from core.settings import Settings
from harness.leader import leader_holder, leader_term
from harness.services import temporary_database
from harness.workers_cluster import admit, tiny_spec
from harness.workers_cluster import submit as submit_spec
from scheduler.live.leader import FileLeadership, LeadershipLost, PostgresLeadership
from scheduler.live.loop import run_cycle
from tests.integration import test_scheduler_support as f
from tests.support.scheduler_loop import LoopThread
from workers.claim import claim
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

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


def standby_beats(path: Path, count: int) -> bool:
    """Whether the loop beating into ``path`` says "standby" ``count`` times: each such beat follows a campaign it
    lost (``run_forever``); a loop that took the lead beats "leading" instead."""
    seen: set[float] = set()

    def another() -> bool:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # no beat yet
            return False
        if record["state"] == "standby":
            seen.add(record["at"])
        return len(seen) >= count

    return wait_for(another)


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
    assert wait_for(lambda: leader_holder(fresh_pg) is not None)
    first_leader = leader_holder(fresh_pg)
    beats = tmp_path / "standby.json"  # the standby's liveness beats: one after each campaign it loses
    standby = Settings(
        database_url=fresh_pg, home=tmp_path, scheduler_interval_s=30.0, liveness_file=beats, standby_retry_s=0.1
    )
    b = LoopThread(standby, record_dispatch)
    try:
        assert standby_beats(beats, 3), "the second loop did not campaign three times as a standby"
        assert leader_holder(fresh_pg) == first_leader  # the standby did not take the lock
        j1 = submit(factory, "one", with_host=True)

        def admitted(job_id: int) -> bool:
            with factory() as db:
                job = db.get(Job, job_id)
                return job is not None and job.state == "ADMITTED"

        # Woken by NOTIFY, long before the 30 s timer.
        assert wait_for(lambda: admitted(j1), timeout=10)
        assert a.halt()  # the leader goes away; its connection closes and the lock with it
        assert wait_for(lambda: leader_holder(fresh_pg) not in (None, first_leader), timeout=40)
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


def _states(factory: sessionmaker[Session], job_id: int) -> tuple[str, int]:
    with factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job.state, len(db.scalars(select(Attempt).where(Attempt.job_id == job_id)).all())


def test_a_leader_that_stops_renewing_loses_its_term_and_its_late_cycle_writes_nothing(
    fresh_pg: str, no_dispatch: list[int], tmp_path: Path
) -> None:
    settings = Settings(database_url=fresh_pg, home=tmp_path, leader_lease_s=1.0)
    engine = make_engine(fresh_pg)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    frozen, standby = PostgresLeadership(fresh_pg, lease_s=1.0), PostgresLeadership(fresh_pg, lease_s=1.0)
    try:
        assert frozen.try_acquire() and not standby.try_acquire()
        job_id = submit(factory, "late", with_host=True)
        # The leader is frozen past its lease (it renews nothing) when the standby takes over.
        assert wait_for(standby.try_acquire) and leader_term(fresh_pg) == 2
        # Woken, it knows by its own clock that it is stale ...
        with pytest.raises(LeadershipLost, match="within the 1 s lease"):
            run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=frozen)
        # ... and were its clock wrong, the database refuses its term.
        frozen.valid_until = time.monotonic() + 60
        with pytest.raises(LeadershipLost, match="term 1 is over"):
            run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=frozen)
        assert _states(factory, job_id) == ("QUEUED", 0) and no_dispatch == []
        result = run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=standby)
        assert result.admitted == [job_id] and _states(factory, job_id) == ("ADMITTED", 1)
    finally:
        frozen.release()
        standby.release()
        engine.dispose()


def test_no_standby_takes_the_lease_while_the_leaders_transaction_holds_it(fresh_pg: str) -> None:
    engine = make_engine(fresh_pg)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    leader, standby = PostgresLeadership(fresh_pg, lease_s=1.0), PostgresLeadership(fresh_pg, lease_s=1.0)
    try:
        assert leader.try_acquire()
        with factory() as db:
            leader.hold(db)  # a cycle's transaction: the term checked, the row locked till it ends
            assert wait_for(lambda: leader_holder(fresh_pg) is None), "the lease never expired"
            assert not standby.try_acquire()  # expired by the clock, but not between the check and the commit
            db.commit()
        assert standby.try_acquire() and leader_term(fresh_pg) == 2
    finally:
        leader.release()
        standby.release()
        engine.dispose()


def _running_attempt(factory: sessionmaker[Session], settings: Settings, silent_s: float) -> tuple[int, int]:
    """A job running on a host whose agent and worker have been silent for ``silent_s`` (the database was away)."""
    with factory() as db:
        agent = HostAgent(name="gap", inventory=NoGpus(), cpu_slots=2, address="127.0.0.1", settings=settings)
        host = agent.register(db)
        db.flush()
        job = submit_spec(db, tiny_spec("gap"))
        attempt = admit(db, job, host)
        claim(
            db,
            attempt_id=attempt.id,
            token=attempt.fencing_token,
            node_rank=0,
            host=host.name,
            delivery="d",
            settings=settings,
        )
        then = utcnow() - timedelta(seconds=silent_s)
        host.last_heartbeat_at, attempt.lease_expires_at = then, then + timedelta(seconds=settings.lease_s)
        db.commit()
        return job.id, attempt.id


def test_grace_counts_from_the_database_s_return_when_the_leader_changes(fresh_pg: str, tmp_path: Path) -> None:
    """The outside chaos run: after a PostgreSQL outage the standby won the lead and declared attempts LOST and a
    live host DOWN 0.9 s after the database came back. Silence that fell where no scheduler held the lease is no
    evidence: the new leader's grace counts from its takeover."""
    settings = Settings(database_url=fresh_pg, home=tmp_path, lease_s=4.0, heartbeat_interval_s=1.0, leader_lease_s=1.0)
    engine = make_engine(fresh_pg)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    old, new = PostgresLeadership(fresh_pg, lease_s=1.0), PostgresLeadership(fresh_pg, lease_s=1.0)
    try:
        assert old.try_acquire()
        run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=old)
        job_id, attempt_id = _running_attempt(factory, settings, silent_s=settings.lease_s + 6)
        # The outage: nobody renews the scheduler's lease either, till it expires and the standby takes it.
        assert wait_for(new.try_acquire)
        result = run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=new)
        assert not any("LOST" in a or "DOWN" in a for a in result.reconciled), result.reconciled
        assert any(a.startswith("no scheduler for ") for a in result.reconciled), result.reconciled
        with factory() as db:
            back = db.scalars(select(Event).where(Event.type == "DATABASE_BACK")).one()
            assert back.data["cause"] == "lease gap" and back.data["unwatched_s"] > 1.0
        assert _states(factory, job_id) == ("RUNNING", 1)
        # Still no evidence half-way through the grace; past it, the silent attempt is LOST and its host DOWN.
        later = utcnow() + timedelta(seconds=settings.lease_s + 1)
        new.valid_until = time.monotonic() + 60  # the test jumps the cycle's clock, not the lease's
        result = run_cycle(
            session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=new, now=later
        )
        assert "host gap: DOWN" in result.reconciled and _states(factory, job_id)[0] == "QUEUED", result.reconciled
        with factory() as db:
            attempt = db.get(Attempt, attempt_id)
            assert attempt is not None and attempt.state == "LOST"
    finally:
        old.release()
        new.release()
        engine.dispose()


def test_a_handover_without_a_gap_gives_no_grace(fresh_pg: str, tmp_path: Path) -> None:
    settings = Settings(database_url=fresh_pg, home=tmp_path, leader_lease_s=10.0)
    engine = make_engine(fresh_pg)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    old, new = PostgresLeadership(fresh_pg, lease_s=10.0), PostgresLeadership(fresh_pg, lease_s=10.0)
    try:
        assert old.try_acquire() and not new.try_acquire()
        run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=old)
        old.release()  # a clean shutdown gives the lease back
        assert new.try_acquire()
        result = run_cycle(session_factory=factory, dispatch=record_dispatch, settings=settings, leadership=new)
        assert result.reconciled == []
        with factory() as db:
            assert not db.scalars(select(Event).where(Event.type == "DATABASE_BACK")).all()
    finally:
        new.release()
        engine.dispose()


def test_the_embedded_scheduler_wakes_at_once_when_a_job_is_submitted_or_lost(
    no_dispatch: list[int], tmp_path: Path
) -> None:
    """SQLite has no NOTIFY: a submit, and a job lost with its worker, touch the database's wake file when they
    commit, and the embedded scheduler runs a cycle at once rather than at its next tick (an hour here)."""
    from sqlalchemy.engine import make_url

    from core.notify import wake_file
    from core.states import JobState
    from core.transitions import transition

    url = f"sqlite:///{tmp_path / 'kiln.db'}"
    upgrade(url)
    wake = wake_file(make_url(url))
    assert wake == tmp_path / "kiln.db.wake"
    engine = make_engine(url)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    loop = LoopThread(Settings(database_url=url, home=tmp_path, scheduler_interval_s=3600.0), record_dispatch)
    try:
        assert wait_for(lambda: loop.cycles() == 1), "no first cycle"  # at start; the next tick is an hour away
        job_id = submit(factory, "woken", with_host=True)
        assert wait_for(lambda: len(no_dispatch) == 1), "the submit did not wake the scheduler"
        stamp = wake.stat().st_mtime_ns
        with factory() as db:
            job = db.get(Job, job_id)
            assert job is not None
            transition(db, job, JobState.RUNNING)
            transition(db, job, JobState.LOST, message="its worker died")
            db.flush()
            assert wake.stat().st_mtime_ns == stamp  # not before the commit: the scheduler would not see it yet
            db.commit()
        assert wake.stat().st_mtime_ns > stamp
    finally:
        assert loop.halt()
        engine.dispose()
