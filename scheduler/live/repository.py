"""Every query the scheduler makes to build its snapshot, in one place. Read-only."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Attempt, Checkpoint, Event, Job, JobDependency, QosClass, SlaContract, Sweep, Team, Usage
from core.repositories.cluster import list_hosts
from core.states import AttemptState, JobState

hosts = list_hosts  # every host by name, its GPUs loaded with it: the query the API lists hosts with


def teams(db: Session) -> Sequence[Team]:
    return db.scalars(select(Team).order_by(Team.id)).all()


def qos_classes(db: Session) -> dict[int, QosClass]:
    return {q.id: q for q in db.scalars(select(QosClass))}


def team_default_contracts(db: Session) -> dict[int, SlaContract]:
    rows = db.scalars(select(SlaContract).where(SlaContract.job_id.is_(None)).order_by(SlaContract.id)).all()
    return {c.team_id: c for c in rows}


def queued_jobs(db: Session) -> Sequence[tuple[Job, SlaContract | None]]:
    """The jobs the policy plans: QUEUED and not held (a held job waits for its release, not for the scheduler)."""
    stmt = (
        select(Job, SlaContract)
        .outerjoin(SlaContract, SlaContract.job_id == Job.id)
        .where(Job.state == JobState.QUEUED.value, Job.held_at.is_(None))
        .order_by(Job.id)
    )
    return [(j, c) for j, c in db.execute(stmt).tuples()]


def last_checkpoints(db: Session, job_ids: Sequence[int]) -> dict[int, tuple[int, datetime]]:
    if not job_ids:
        return {}
    stmt = (
        select(Checkpoint.job_id, func.max(Checkpoint.step), func.max(Checkpoint.created_at))
        .where(Checkpoint.job_id.in_(job_ids), Checkpoint.verified.is_(True))
        .group_by(Checkpoint.job_id)
    )
    return {jid: (step, at) for jid, step, at in db.execute(stmt).tuples()}


def preemption_counts(db: Session, job_ids: Sequence[int]) -> dict[int, int]:
    """How often each job was preempted before (its PREEMPTING events): victims already pushed back go last."""
    if not job_ids:
        return {}
    stmt = (
        select(Event.job_id, func.count())
        .where(Event.job_id.in_(job_ids), Event.type == JobState.PREEMPTING.value)
        .group_by(Event.job_id)
    )
    return {int(job_id): int(n) for job_id, n in db.execute(stmt).tuples() if job_id is not None}


def lost_on_hosts(db: Session, job_ids: Sequence[int]) -> dict[int, frozenset[str]]:
    """For jobs whose latest attempt was LOST: the hosts it ran on (a restart prefers other hosts)."""
    if not job_ids:
        return {}
    latest = (
        select(Attempt.job_id, func.max(Attempt.number).label("number"))
        .where(Attempt.job_id.in_(job_ids))
        .group_by(Attempt.job_id)
        .subquery()
    )
    rows = db.execute(
        select(Attempt.job_id, Attempt.placement)
        .join(latest, (Attempt.job_id == latest.c.job_id) & (Attempt.number == latest.c.number))
        .where(Attempt.state == AttemptState.LOST)
    ).all()
    return {
        job_id: frozenset(str(p["host"]) for p in placement or [] if isinstance(p, dict) and p.get("host"))
        for job_id, placement in rows
    }


def dependencies(db: Session, job_ids: Sequence[int]) -> dict[int, list[tuple[int, str, str]]]:
    if not job_ids:
        return {}
    stmt = (
        select(JobDependency.job_id, JobDependency.depends_on_id, Job.state, JobDependency.condition)
        .join(Job, Job.id == JobDependency.depends_on_id)
        .where(JobDependency.job_id.in_(job_ids))
        .order_by(JobDependency.job_id, JobDependency.depends_on_id)
    )
    out: dict[int, list[tuple[int, str, str]]] = {}
    for jid, dep, state, condition in db.execute(stmt).tuples():
        out.setdefault(jid, []).append((dep, state, condition))
    return out


def sweep_limits(db: Session, sweep_ids: Collection[int]) -> dict[int, int]:
    """The ``max_concurrent`` of each of these sweeps that has one."""
    if not sweep_ids:
        return {}
    stmt = select(Sweep.id, Sweep.max_concurrent).where(Sweep.id.in_(sweep_ids), Sweep.max_concurrent.is_not(None))
    return {sid: limit for sid, limit in db.execute(stmt).tuples() if limit is not None}


def usage_since(db: Session, since: datetime) -> Sequence[Usage]:
    stmt = select(Usage).where((Usage.ended_at.is_(None)) | (Usage.ended_at >= since)).order_by(Usage.id)
    return db.scalars(stmt).all()


def horizon(now: datetime, half_life_s: float, teams_: Sequence[Team]) -> datetime:
    """How far back usage matters: eight half-lives of decay, or the longest budget period."""
    longest = max((t.budget_period_s for t in teams_), default=0)
    return now - timedelta(seconds=max(8 * half_life_s, float(longest)))


def attained_seconds(db: Session, job_ids: Sequence[int]) -> dict[int, float]:
    """Seconds each job's ended attempts ran (its attained service; the running attempt is not included)."""
    if not job_ids:
        return {}
    stmt = select(Attempt.job_id, Attempt.started_at, Attempt.ended_at).where(
        Attempt.job_id.in_(job_ids), Attempt.started_at.is_not(None), Attempt.ended_at.is_not(None)
    )
    out: dict[int, float] = {}
    for job_id, started, ended in db.execute(stmt).tuples():
        if started is None or ended is None:
            continue
        out[job_id] = out.get(job_id, 0.0) + max(0.0, (ended - started).total_seconds())
    return out


def finished_history(db: Session, per_team: int) -> dict[int, list[tuple[float, float | None]]]:
    """Each team's most recently succeeded jobs (up to ``per_team``): (seconds its attempts ran, its time limit)."""
    recent = (
        select(
            Job.id,
            Job.team_id,
            Job.spec["time_limit_s"].as_float().label("limit"),
            func.row_number().over(partition_by=Job.team_id, order_by=Job.finished_at.desc()).label("n"),
        )
        .where(Job.state == JobState.SUCCEEDED.value, Job.finished_at.is_not(None))
        .subquery()
    )
    stmt = (
        select(recent.c.team_id, recent.c.limit, Attempt.job_id, Attempt.started_at, Attempt.ended_at)
        .join(Attempt, Attempt.job_id == recent.c.id)
        .where(recent.c.n <= per_team, Attempt.started_at.is_not(None), Attempt.ended_at.is_not(None))
    )
    ran: dict[int, tuple[int, float | None, float]] = {}
    for team_id, limit, job_id, started, ended in db.execute(stmt).tuples():
        if started is None or ended is None:
            continue
        seconds = ran[job_id][2] if job_id in ran else 0.0
        ran[job_id] = (team_id, limit, seconds + max(0.0, (ended - started).total_seconds()))
    out: dict[int, list[tuple[float, float | None]]] = {}
    for team_id, limit, seconds in ran.values():
        out.setdefault(team_id, []).append((seconds, limit if limit and limit > 0 else None))
    return out
