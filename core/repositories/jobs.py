"""Jobs and what hangs off them: events, attempts, checkpoints, metrics, dependencies, effective contracts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from core.models import Attempt, Checkpoint, Event, Job, JobDependency, JobMetric, QosClass, SlaContract, Team, User

# (job, team name, user name, qos name): what a JobOut needs, in one query.
JobRow = tuple[Job, str, str | None, str]


@dataclass(frozen=True)
class JobFilter:
    team_ids: Sequence[int] | None = None  # visibility: None = all teams
    team_id: int | None = None
    states: Sequence[str] = ()
    qos_id: int | None = None
    name: str | None = None
    before_id: int | None = None  # keyset: strictly older than this id


def _job_select() -> Select[Job, str, str | None, str]:
    return (
        select(Job, Team.name, User.name, QosClass.name)
        .join(Team, Team.id == Job.team_id)
        .outerjoin(User, User.id == Job.user_id)
        .join(QosClass, QosClass.id == Job.qos_class_id)
    )


def get_row(db: Session, job_id: int) -> JobRow | None:
    return db.execute(_job_select().where(Job.id == job_id)).tuples().one_or_none()


def get(db: Session, job_id: int, *, for_update: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    return db.scalars(stmt).one_or_none()


def list_rows(db: Session, flt: JobFilter, limit: int) -> Sequence[JobRow]:
    """Newest first; ``limit`` rows at most (callers ask for one more to know whether a next page exists)."""
    stmt = _job_select()
    if flt.team_ids is not None:
        stmt = stmt.where(Job.team_id.in_(flt.team_ids))
    if flt.team_id is not None:
        stmt = stmt.where(Job.team_id == flt.team_id)
    if flt.states:
        stmt = stmt.where(Job.state.in_(flt.states))
    if flt.qos_id is not None:
        stmt = stmt.where(Job.qos_class_id == flt.qos_id)
    if flt.name is not None:
        stmt = stmt.where(Job.name == flt.name)
    if flt.before_id is not None:
        stmt = stmt.where(Job.id < flt.before_id)
    return db.execute(stmt.order_by(Job.id.desc()).limit(limit)).tuples().all()


def existing_ids_in_team(db: Session, *, team_id: int, job_ids: Sequence[int]) -> set[int]:
    if not job_ids:
        return set()
    return set(db.scalars(select(Job.id).where(Job.team_id == team_id, Job.id.in_(job_ids))))


def dependency_ids(db: Session, job_id: int) -> list[int]:
    stmt = select(JobDependency.depends_on_id).where(JobDependency.job_id == job_id)
    return list(db.scalars(stmt.order_by(JobDependency.depends_on_id)))


def effective_sla(db: Session, job_id: int) -> SlaContract | None:
    return db.scalars(select(SlaContract).where(SlaContract.job_id == job_id)).one_or_none()


def events(db: Session, *, job_id: int, after_id: int, limit: int) -> Sequence[tuple[Event, str | None]]:
    stmt = (
        select(Event, User.name)
        .outerjoin(User, User.id == Event.actor_user_id)
        .where(Event.job_id == job_id, Event.id > after_id)
        .order_by(Event.id)
        .limit(limit)
    )
    return db.execute(stmt).tuples().all()


def attempts(db: Session, job_id: int) -> Sequence[Attempt]:
    return db.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)).all()


def latest_attempt_number(db: Session, job_id: int) -> int | None:
    return db.scalar(select(func.max(Attempt.number)).where(Attempt.job_id == job_id))


def checkpoints(db: Session, job_id: int) -> Sequence[Checkpoint]:
    return db.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)).all()


def metrics(db: Session, *, job_id: int, after_step: int, max_points: int) -> Sequence[JobMetric]:
    """Rows with step > after_step, thinned to at most ``max_points`` by an even stride (the last row kept)."""
    where = (JobMetric.job_id == job_id, JobMetric.step > after_step)
    total = db.scalar(select(func.count()).select_from(JobMetric).where(*where)) or 0
    if total <= max_points:
        return db.scalars(select(JobMetric).where(*where).order_by(JobMetric.step, JobMetric.id)).all()
    # Rows 1, 1+stride, ... and the last: at most max_points, first and last always kept.
    stride = max(1, -(-(total - 1) // max(max_points - 1, 1))) if max_points > 1 else total
    numbered = (
        select(JobMetric.id, func.row_number().over(order_by=(JobMetric.step, JobMetric.id)).label("rn"))
        .where(*where)
        .subquery()
    )
    first = 1 if max_points > 1 else total
    keep = select(numbered.c.id).where(
        (((numbered.c.rn - first) % stride == 0) & (numbered.c.rn >= first)) | (numbered.c.rn == total)
    )
    return db.scalars(select(JobMetric).where(JobMetric.id.in_(keep)).order_by(JobMetric.step, JobMetric.id)).all()


def count_by_state(db: Session) -> dict[str, int]:
    return dict(db.execute(select(Job.state, func.count()).group_by(Job.state)).tuples().all())
