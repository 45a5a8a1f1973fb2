"""The live scheduler cycle on PostgreSQL: admit, preempt and readmit, reclaim lent quota, hold over budget."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Attempt, Event, Job
from core.states import JobState
from scheduler.live.loop import _until, run_cycle
from tests.integration import test_scheduler_support as f

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


SENT: list[tuple[int, int, list[Any]]] = []  # what ``cycle`` dispatched (no broker in these tests)


def record_dispatch(attempt_id: int, token: int, placement: list[Any]) -> None:
    SENT.append((attempt_id, token, placement))


@pytest.fixture
def dispatched() -> Iterator[list[tuple[int, int, list[Any]]]]:
    SENT.clear()
    yield SENT
    SENT.clear()


def cycle(db: Session, now: datetime) -> Any:
    """One cycle on the test's session (kept open: run_cycle closes the sessions it is given)."""
    heartbeat(db, now)  # the hosts' agents are alive
    close = db.close
    db.close = lambda: None  # type: ignore[method-assign]
    try:
        result = run_cycle(session_factory=lambda: db, dispatch=record_dispatch, now=now)
    finally:
        db.close = close  # type: ignore[method-assign]
    db.expire_all()
    return result


def heartbeat(db: Session, now: datetime) -> None:
    from core.models import Host

    for h in db.scalars(select(Host)):
        h.last_heartbeat_at = now
        h.state = "UP"
    for a in db.scalars(select(Attempt).where(Attempt.state == "RUNNING")):
        a.lease_expires_at = now + timedelta(hours=1)
        a.heartbeat_at = now
    db.flush()


def test_admits_with_gang_placement_and_fencing_token(db: Session, dispatched: list[Any]) -> None:
    t = f.team(db, "ml")
    f.host(db, "a1", 8, now=T0)
    f.host(db, "a2", 8, now=T0)
    j1 = f.job(db, t, f.qos(db, "silver"), gpus=16, submitted_at=T0)
    j2 = f.job(db, t, f.qos(db, "silver"), gpus=16, submitted_at=T0 + timedelta(seconds=1))
    result = cycle(db, T0 + timedelta(seconds=5))
    assert result.admitted == [j1.id]
    db.refresh(j1)
    db.refresh(j2)
    assert j1.state == JobState.ADMITTED and j1.fencing_token == 1
    attempt = db.scalars(select(Attempt).where(Attempt.job_id == j1.id)).one()
    assert attempt.fencing_token == 1 and attempt.state == "PENDING"
    assert sorted(p["host"] for p in attempt.placement) == ["a1", "a2"]
    assert sorted(p["node_rank"] for p in attempt.placement) == [0, 1]
    assert all(len(p["gpus"]) == 8 and p["queue"] == f"host.{p['host']}" for p in attempt.placement)
    assert dispatched == [(attempt.id, 1, attempt.placement)]
    assert j2.state == JobState.QUEUED and j2.pending_reason in ("Resources", "Reservation")
    assert j2.pending_message


def running_until(db: Session, job: Job, later: datetime) -> datetime:
    """``job`` admitted by a cycle at T0 and started at once; its host's agent and attempt heartbeat at ``later``,
    which is returned."""
    assert cycle(db, T0).admitted == [job.id]
    f.start(db, job, now=T0)
    heartbeat(db, later)
    return later


def test_preempts_lower_class_then_readmits_it(db: Session, dispatched: list[Any]) -> None:
    t = f.team(db, "ml")
    f.host(db, "b1", 8, now=T0)
    low = f.job(db, t, f.qos(db, "bronze"), gpus=8, submitted_at=T0)
    later = running_until(db, low, T0 + timedelta(minutes=30))
    gold = f.job(db, t, f.qos(db, "gold"), gpus=8, submitted_at=later)
    # The preemption budget: a job preempts only at risk of its SLA or once it holds a reservation (the head of
    # its class, from the cycle before).
    first = cycle(db, later + timedelta(milliseconds=500))
    assert first.preempted == [] and db.get(Job, gold.id).pending_reason == "Reservation"  # type: ignore[union-attr]
    result = cycle(db, later + timedelta(seconds=1))
    assert result.preempted == [low.id] and result.admitted == []
    db.refresh(low)
    db.refresh(gold)
    assert low.state == JobState.PREEMPTING and low.preempt_requested
    assert gold.pending_reason == "Reservation"
    # Still checkpointing: nothing more happens, and no second victim is chosen.
    assert cycle(db, later + timedelta(seconds=2)).preempted == []
    f.requeue_preempted(db, low, now=later + timedelta(seconds=20), step=1234)
    result = cycle(db, later + timedelta(seconds=21))
    db.refresh(gold)
    assert result.admitted == [gold.id], (gold.pending_reason, gold.pending_message, result)
    db.refresh(low)
    assert low.state == JobState.QUEUED and low.last_step == 1234
    assert low.pending_reason in ("Resources", "Reservation", "Priority")
    # Gold finishes; the victim comes back with its progress.
    f.start(db, gold, now=later + timedelta(seconds=22))
    gold_row = db.get(Job, gold.id)
    assert gold_row is not None
    from core.transitions import transition

    transition(db, gold_row, JobState.SUCCEEDED)
    for a in db.scalars(select(Attempt).where(Attempt.job_id == gold.id)):
        a.ended_at = later + timedelta(hours=1)
    heartbeat(db, later + timedelta(hours=1))
    result = cycle(db, later + timedelta(hours=1, seconds=1))
    assert result.admitted == [low.id]
    db.refresh(low)
    assert low.state == JobState.ADMITTED and low.fencing_token == 2 and low.last_step == 1234
    numbers = sorted(a.number for a in db.scalars(select(Attempt).where(Attempt.job_id == low.id)))
    assert numbers == [1, 2]
    types = [e.type for e in db.scalars(select(Event).where(Event.job_id == low.id).order_by(Event.id))]
    assert types[:3] == ["ADMITTED", "RUNNING", "PREEMPTING"] and "QUEUED" in types and types[-1] == "ADMITTED"


def test_reclaims_lent_quota_from_a_borrower(db: Session, dispatched: list[Any]) -> None:
    lender = f.team(db, "lender", cohort="research", quotas={"*": (8, None, None)})
    borrower = f.team(db, "borrower", cohort="research", quotas={"*": (8, 8, None)})
    f.host(db, "c1", 8, now=T0)
    f.host(db, "c2", 8, now=T0)
    silver = f.qos(db, "silver")  # not preemptible: only the borrowing makes these jobs victims
    b1 = f.job(db, borrower, silver, gpus=8, submitted_at=T0)
    b2 = f.job(db, borrower, silver, gpus=8, submitted_at=T0 + timedelta(seconds=1))
    result = cycle(db, T0 + timedelta(seconds=2))
    assert sorted(result.admitted) == [b1.id, b2.id]  # 8 of its own + 8 borrowed from the lender
    f.start(db, b1, now=T0 + timedelta(seconds=3))
    f.start(db, b2, now=T0 + timedelta(seconds=4))
    later = T0 + timedelta(hours=1)
    heartbeat(db, later)
    mine = f.job(db, lender, silver, gpus=8, submitted_at=later)
    # The preemption budget: it waits (Quota) until half its max queue wait (silver: 30 min) has passed.
    assert cycle(db, later + timedelta(seconds=1)).preempted == []
    later += timedelta(seconds=901)
    heartbeat(db, later)
    result = cycle(db, later + timedelta(seconds=1))
    assert len(result.preempted) == 1 and result.preempted[0] in (b1.id, b2.id)
    victim = db.get(Job, result.preempted[0])
    assert victim is not None and victim.state == JobState.PREEMPTING
    event = db.scalars(select(Event).where(Event.job_id == victim.id, Event.type == "PREEMPTING")).one()
    assert "reclaimed" in event.message
    f.requeue_preempted(db, victim, now=later + timedelta(seconds=30), step=10)
    result = cycle(db, later + timedelta(seconds=31))
    db.refresh(mine)
    assert result.admitted == [mine.id], (mine.pending_reason, mine.pending_message, mine.id, victim.id, b1.id, b2.id)
    db.refresh(victim)
    assert victim.state == JobState.QUEUED and victim.pending_reason == "Quota"
    assert victim.pending_message and "cohort research" in victim.pending_message


def test_a_team_at_its_quota_gives_its_own_silver_way_to_its_gold(db: Session, dispatched: list[Any]) -> None:
    """Free GPUs, but the team's quota is full of its own silver (not preemptible by other teams): its gold job
    preempts that silver job (checkpoint first), where it would otherwise wait with Quota."""
    solo = f.team(db, "solo", quotas={"*": (8, 0, None)})  # no borrowing
    f.host(db, "q1", 8, now=T0)
    f.host(db, "q2", 8, now=T0)
    mine = f.job(db, solo, f.qos(db, "silver"), gpus=8, submitted_at=T0)
    later = running_until(db, mine, T0 + timedelta(minutes=30))
    gold = f.job(db, solo, f.qos(db, "gold"), gpus=8, submitted_at=later)
    # The preemption budget: it waits (Quota) until half its max queue wait (gold: 5 min) has passed.
    assert cycle(db, later + timedelta(seconds=1)).preempted == []
    later += timedelta(seconds=151)
    heartbeat(db, later)
    result = cycle(db, later + timedelta(seconds=1))
    assert result.preempted == [mine.id] and result.admitted == []
    event = db.scalars(select(Event).where(Event.job_id == mine.id, Event.type == "PREEMPTING")).one()
    assert f"preempted for job {gold.id} of its own team (gold outranks silver)" in event.message
    f.requeue_preempted(db, mine, now=later + timedelta(seconds=20), step=77)
    assert cycle(db, later + timedelta(seconds=21)).admitted == [gold.id]
    db.refresh(mine)
    assert mine.state == JobState.QUEUED and mine.last_step == 77 and mine.pending_reason == "Quota"


def test_over_budget_job_waits_with_budget_reason(db: Session, dispatched: list[Any]) -> None:
    t = f.team(db, "thrifty", budget=10.0, created_at=T0 - timedelta(days=1))
    other = f.team(db, "rich")
    f.host(db, "d1", 8, now=T0)
    q = f.qos(db, "silver")
    spent = f.job(db, t, q, gpus=4, submitted_at=T0 - timedelta(hours=5))
    assert cycle(db, T0 - timedelta(hours=5)).admitted == [spent.id]
    f.start(db, spent, now=T0 - timedelta(hours=5))  # 4 GPUs x 5 h = 20 GPU-hours > 10
    heartbeat(db, T0)
    over = f.job(db, t, q, gpus=1, submitted_at=T0)
    fine = f.job(db, other, q, gpus=1, submitted_at=T0)
    result = cycle(db, T0 + timedelta(seconds=1))
    assert result.admitted == [fine.id]
    db.refresh(over)
    assert over.state == JobState.QUEUED and over.pending_reason == "Budget"
    assert over.pending_message and "GPU-hours" in over.pending_message
    event = db.scalars(select(Event).where(Event.job_id == over.id, Event.type == "PENDING")).one()
    assert event.data["reason"] == "Budget"
    # Unchanged reason: not rewritten, no new event.
    assert cycle(db, T0 + timedelta(seconds=2)).reasons_written == 0


def test_failed_dependency_fails_the_job(db: Session, dispatched: list[Any]) -> None:
    from core.models import JobDependency
    from core.transitions import transition

    t = f.team(db, "deps")
    f.host(db, "e1", 8, now=T0)
    q = f.qos(db, "silver")
    first = f.job(db, t, q, gpus=1, submitted_at=T0)
    second = f.job(db, t, q, gpus=1, submitted_at=T0)
    db.add(JobDependency(job_id=second.id, depends_on_id=first.id))
    db.flush()
    result = cycle(db, T0 + timedelta(seconds=1))
    assert result.admitted == [first.id]
    db.refresh(second)
    assert second.pending_reason == "Dependency"
    transition(db, first, JobState.FAILED)
    result = cycle(db, T0 + timedelta(seconds=2))
    db.refresh(second)
    assert result.failed == [second.id] and second.state == JobState.FAILED
    assert second.exit_reason and str(first.id) in second.exit_reason


def test_the_snapshot_carries_attained_service_and_the_teams_history(db: Session, dispatched: list[Any]) -> None:
    """What kiln's service classes read in the live loop: the run time of a job's ended attempts, and the team's
    finished jobs (their run times and how much of their time limits they used). Never a true run time."""
    from scheduler.live.loader import load_snapshot

    t = f.team(db, "history")
    f.host(db, "h1", 8, now=T0)
    silver = f.qos(db, "silver")
    done = f.job(db, t, silver, gpus=8, submitted_at=T0, time_limit_s=4 * 3600.0)
    assert cycle(db, T0).admitted == [done.id]
    f.start(db, done, now=T0)
    row = db.get(Job, done.id)
    assert row is not None
    from core.transitions import transition

    transition(db, row, JobState.SUCCEEDED)
    row.finished_at = T0 + timedelta(hours=1)
    for a in db.scalars(select(Attempt).where(Attempt.job_id == done.id)):
        a.ended_at = T0 + timedelta(hours=1)
    again = f.job(db, t, silver, gpus=8, submitted_at=T0 + timedelta(hours=1))
    assert cycle(db, T0 + timedelta(hours=1, seconds=1)).admitted == [again.id]
    f.start(db, again, now=T0 + timedelta(hours=1, seconds=2))
    f.requeue_preempted(db, again, now=T0 + timedelta(hours=1, minutes=31), step=10)
    snap = load_snapshot(db=db, now=T0 + timedelta(hours=2))
    team = next(ti for ti in snap.teams if ti.id == t.id)
    assert team.finished_runtimes_s == (3600.0,) and team.limit_use_ratio == 0.25
    (pending,) = [p for p in snap.pending if p.id == again.id]
    assert abs(pending.attained_s - (31 * 60 - 2)) < 1e-6 and pending.estimated_runtime_s is None


def test_a_cycle_says_when_a_backed_off_job_is_due(db: Session, dispatched: list[Any]) -> None:
    """A requeued job waits out its backoff; the leader's next cycle is due when it ends, not an interval later
    (issue 40: a lost job's restart waited up to the 2 s interval after its 1 s backoff)."""
    t = f.team(db, "ml")
    f.host(db, "c1", 8, now=T0)
    job = f.job(db, t, f.qos(db, "silver"), gpus=8, submitted_at=T0)
    job.not_before = T0 + timedelta(seconds=1)
    db.flush()
    first = cycle(db, T0 + timedelta(milliseconds=100))
    assert first.admitted == [] and first.next_due == pytest.approx((T0 + timedelta(seconds=1)).timestamp())
    second = cycle(db, T0 + timedelta(seconds=1, milliseconds=50))
    assert second.admitted == [job.id] and second.next_due is None
    # The leader waits until then (a margin after), never past its interval, never a negative time.
    now = time.time()
    assert _until(None, 2.0) == 2.0 and _until(now + 30.0, 2.0) == 2.0 and _until(now - 5.0, 2.0) == 0.0
    assert 0.4 < _until(now + 0.5, 2.0) <= 0.55
