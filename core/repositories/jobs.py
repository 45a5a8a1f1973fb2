"""Jobs and what hangs off them: events, attempts, checkpoints, metrics, dependencies, effective contracts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Row,
    Select,
    String,
    Text,
    bindparam,
    cast,
    delete,
    false,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import psycopg as postgresql_psycopg
from sqlalchemy.orm import Session

from core.models import (
    Attempt,
    Checkpoint,
    Event,
    Job,
    JobDependency,
    JobMetric,
    QosClass,
    SlaContract,
    Sweep,
    Team,
    User,
)
from core.queue_wait import current_wait_start_sql
from core.repositories.keyset import Window, page
from core.states import ACTIVE, UNFINISHED


@dataclass(frozen=True)
class JobFilter:
    team_ids: Sequence[int] | None = None  # visibility: None = all teams
    team_id: int | None = None
    states: Sequence[str] = ()
    qos_id: int | None = None
    name: str | None = None
    user: str | None = None  # the submitter's name
    before_id: int | None = None  # keyset: strictly older than this id
    job_id: int | None = None  # one job
    submitted_after: datetime | None = None  # at or after (UTC-aware)
    submitted_before: datetime | None = None  # strictly before
    held: bool | None = None  # held (kiln hold) or not; None: either
    sweep_id: int | None = None  # one sweep's jobs


def count_unfinished(db: Session, team_id: int) -> int:
    """The team's jobs that have not ended (queued, held, admitted, running, preempting, paused, lost)."""
    stmt = select(func.count()).select_from(Job).where(Job.team_id == team_id, Job.state.in_(UNFINISHED))
    return int(db.scalar(stmt) or 0)


def of_sweep(db: Session, sweep_id: int) -> Sequence[Job]:
    return db.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.id)).all()


def states_of_sweep(db: Session, sweep_id: int) -> list[str]:
    """Its jobs' states as the database has them now (columns, not the session's copies of the rows)."""
    return list(db.scalars(select(Job.state).where(Job.sweep_id == sweep_id)))


def sweeps(db: Session, *, team_ids: Sequence[int] | None, window: Window | None = None) -> Sequence[Sweep]:
    """Newest first, in the visible teams (None: all)."""
    stmt = select(Sweep)
    if team_ids is not None:
        stmt = stmt.where(Sweep.team_id.in_(team_ids))
    return db.scalars(page(stmt, [(Sweep.id, True)], window)).all()


def by_idempotency_key(db: Session, *, team_id: int, key: str) -> Job | None:
    return db.scalars(select(Job).where(Job.team_id == team_id, Job.idempotency_key == key)).one_or_none()


def get(db: Session, job_id: int, *, for_update: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    return db.scalars(stmt).one_or_none()


# The job list's columns, in this order: ``JobOut``'s fields, ``steps`` read from the spec, the spec last and as
# JSON text (the API splices it into its answer unparsed).
LIST_COLUMNS = (
    "id",
    "name",
    "team",
    "user",
    "state",
    "qos",
    "priority",
    "gpus",
    "gpu_type",
    "pending_reason",
    "pending_message",
    "restart_count",
    "last_step",
    "last_loss",
    "steps",
    "exit_reason",
    "cancel_requested",
    "submitted_at",
    "admitted_at",
    "started_at",
    "finished_at",
    "queued_s",
    "waiting_since",
    "held_at",
    "spec_json",
)


@dataclass(frozen=True)
class _ListShape:
    """What a filter sets (and how many teams and states), not its values: one statement per shape."""

    teams: int | None  # how many visible teams; None = all teams
    team: bool
    states: int
    qos: bool
    name: bool
    user: bool
    before: bool
    job: bool
    submitted_after: bool = False
    submitted_before: bool = False
    held: bool | None = None
    sweep: bool = False


def list_rows(db: Session, flt: JobFilter, limit: int) -> Sequence[Row[Any]]:
    """Newest first; ``limit`` rows at most (callers ask for one more to know whether a next page exists); rows
    of ``LIST_COLUMNS``, on every database.

    One statement (``_list_statement``). On PostgreSQL it runs as driver SQL compiled once per filter shape, so a
    request builds, cache-keys and compiles nothing, and psycopg prepares the same text each time; elsewhere
    (SQLite) through SQLAlchemy, whose types turn its stored text back into datetimes."""
    shape, params = _bound(flt, limit)
    conn = db.connection()
    if conn.dialect.name == "postgresql":
        sql, own = _list_sql_pg(shape)
        return conn.exec_driver_sql(sql, {**own, **params}).all()
    return conn.execute(_list_statement(shape), params).all()


def list_sql_pg(flt: JobFilter, limit: int) -> tuple[str, dict[str, Any]]:
    """The SQL text and parameters ``list_rows`` runs on PostgreSQL for ``flt`` (the bench EXPLAINs it)."""
    shape, params = _bound(flt, limit)
    sql, own = _list_sql_pg(shape)
    return sql, {**own, **params}


def _bound(flt: JobFilter, limit: int) -> tuple[_ListShape, dict[str, Any]]:
    shape = _ListShape(
        teams=None if flt.team_ids is None else len(flt.team_ids),
        team=flt.team_id is not None,
        states=len(flt.states),
        qos=flt.qos_id is not None,
        name=flt.name is not None,
        user=flt.user is not None,
        before=flt.before_id is not None,
        job=flt.job_id is not None,
        submitted_after=flt.submitted_after is not None,
        submitted_before=flt.submitted_before is not None,
        held=flt.held,
        sweep=flt.sweep_id is not None,
    )
    params: dict[str, Any] = {"limit": limit}
    params.update((f"t{i}", team_id) for i, team_id in enumerate(flt.team_ids or ()))
    params.update((f"s{i}", state) for i, state in enumerate(flt.states))
    named = {
        "team_id": flt.team_id,
        "qos_id": flt.qos_id,
        "name": flt.name,
        "user": flt.user,
        "before_id": flt.before_id,
        "job_id": flt.job_id,
        "submitted_after": flt.submitted_after,
        "submitted_before": flt.submitted_before,
        "sweep_id": flt.sweep_id,
    }
    params.update((key, value) for key, value in named.items() if value is not None)
    return shape, params


@lru_cache(maxsize=256)
def _list_statement(shape: _ListShape) -> Select[Any]:
    """The list query: a backward keyset scan of ``ix_jobs_team_id_id`` (team filter + ``ORDER BY id DESC``)
    joined with the team, user and QoS names. Every value is a named parameter (``list_rows`` binds them)."""
    jobs = Job.__table__
    columns = {
        "team": Team.name,
        "user": User.name,
        "qos": QosClass.name,
        "steps": func.coalesce(jobs.c.spec["steps"].as_integer(), 0),
        "spec_json": cast(jobs.c.spec, Text),
        "waiting_since": current_wait_start_sql(),  # the client adds the wait so far to queued_s
    }
    stmt = (
        select(*(columns[name].label(name) if name in columns else jobs.c[name] for name in LIST_COLUMNS))
        .join_from(jobs, Team, Team.id == jobs.c.team_id)
        .outerjoin(User, User.id == jobs.c.user_id)
        .join(QosClass, QosClass.id == jobs.c.qos_class_id)
    )
    if shape.teams is not None:
        teams = [bindparam(f"t{i}", type_=BigInteger) for i in range(shape.teams)]
        stmt = stmt.where(jobs.c.team_id.in_(teams) if teams else false())
    if shape.team:
        stmt = stmt.where(jobs.c.team_id == bindparam("team_id"))
    if shape.states:
        stmt = stmt.where(jobs.c.state.in_([bindparam(f"s{i}", type_=String) for i in range(shape.states)]))
    if shape.qos:
        stmt = stmt.where(jobs.c.qos_class_id == bindparam("qos_id"))
    if shape.name:
        stmt = stmt.where(jobs.c.name == bindparam("name"))
    if shape.user:
        stmt = stmt.where(User.name == bindparam("user"))
    if shape.before:
        stmt = stmt.where(jobs.c.id < bindparam("before_id"))
    if shape.job:
        stmt = stmt.where(jobs.c.id == bindparam("job_id"))
    if shape.submitted_after:
        stmt = stmt.where(jobs.c.submitted_at >= bindparam("submitted_after", type_=jobs.c.submitted_at.type))
    if shape.submitted_before:
        stmt = stmt.where(jobs.c.submitted_at < bindparam("submitted_before", type_=jobs.c.submitted_at.type))
    if shape.held is not None:
        stmt = stmt.where(jobs.c.held_at.is_not(None) if shape.held else jobs.c.held_at.is_(None))
    if shape.sweep:
        stmt = stmt.where(jobs.c.sweep_id == bindparam("sweep_id"))
    return stmt.order_by(jobs.c.id.desc()).limit(bindparam("limit", type_=Integer))


@lru_cache(maxsize=256)
def _list_sql_pg(shape: _ListShape) -> tuple[str, dict[str, Any]]:
    """``_list_statement`` as PostgreSQL driver SQL (psycopg's ``%(name)s`` placeholders), and the values of the
    parameters the statement holds itself (the spec's key, the default of ``steps``)."""
    compiled = _list_statement(shape).compile(dialect=postgresql_psycopg.dialect())
    own = {name: bind.value for bind, name in compiled.bind_names.items() if not bind.required}
    return str(compiled), own


UTC_ZONES = frozenset({"UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu"})


def session_is_utc(db: Session) -> bool:
    """Whether the connection's ``TimeZone`` is UTC (PostgreSQL hands timestamptz over in the session's zone; the
    API answers in UTC). No round trip: psycopg keeps the server's parameter status."""
    raw = db.connection().connection.driver_connection
    tz = getattr(getattr(raw, "info", None), "timezone", None)
    return getattr(tz, "key", None) in UTC_ZONES


def dependencies(db: Session, job_id: int) -> list[tuple[int, str]]:
    """(job id, condition) of each job ``job_id`` depends on, by id."""
    stmt = select(JobDependency.depends_on_id, JobDependency.condition).where(JobDependency.job_id == job_id)
    return [(dep, condition) for dep, condition in db.execute(stmt.order_by(JobDependency.depends_on_id)).tuples()]


def dependency_closure(db: Session, job_ids: set[int]) -> set[int]:
    """Every job that one of ``job_ids`` waits for, directly or through others: one query per level."""
    seen: set[int] = set()
    frontier = set(job_ids)
    while frontier:
        stmt = select(JobDependency.depends_on_id).where(JobDependency.job_id.in_(frontier))
        frontier = set(db.scalars(stmt)) - seen
        seen |= frontier
    return seen


DEPENDENCY_LOCK_KEY = 0x6B696C6E + 2  # beside the scheduler's leader and cycle locks ("kiln", + 1)


def lock_dependency_graph(db: Session) -> None:
    """Changes of existing jobs' dependencies one at a time, until the transaction ends (PostgreSQL; SQLite runs one
    writer at a time anyway). A submission needs no lock: a new job cannot be waited for yet."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": DEPENDENCY_LOCK_KEY})


def replace_dependencies(db: Session, *, job_id: int, depends_on: Sequence[tuple[int, str]]) -> None:
    db.execute(delete(JobDependency).where(JobDependency.job_id == job_id))
    db.add_all(JobDependency(job_id=job_id, depends_on_id=dep, condition=cond) for dep, cond in depends_on)


def existing_ids_in_team(db: Session, *, team_id: int, job_ids: Sequence[int]) -> set[int]:
    if not job_ids:
        return set()
    return set(db.scalars(select(Job.id).where(Job.team_id == team_id, Job.id.in_(job_ids))))


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


def active_jobs(db: Session) -> Sequence[tuple[Job, Attempt | None]]:
    """Jobs that hold capacity, each with its current attempt (the one whose token is the job's)."""
    stmt = (
        select(Job, Attempt)
        .outerjoin(Attempt, (Attempt.job_id == Job.id) & (Attempt.fencing_token == Job.fencing_token))
        .where(Job.state.in_([s.value for s in ACTIVE]))
        .order_by(Job.id)
    )
    return [(j, a) for j, a in db.execute(stmt).tuples()]


def attempts(db: Session, job_id: int, window: Window | None = None) -> Sequence[Attempt]:
    return db.scalars(page(select(Attempt).where(Attempt.job_id == job_id), [(Attempt.number, False)], window)).all()


def latest_attempt_number(db: Session, job_id: int) -> int | None:
    return db.scalar(select(func.max(Attempt.number)).where(Attempt.job_id == job_id))


def checkpoints(db: Session, job_id: int, window: Window | None = None) -> Sequence[Checkpoint]:
    stmt = select(Checkpoint).where(Checkpoint.job_id == job_id)
    return db.scalars(page(stmt, [(Checkpoint.step, False)], window)).all()


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


def metrics_after_id(db: Session, *, job_id: int, after_id: int, limit: int) -> Sequence[JobMetric]:
    """Rows in insertion order after ``after_id``, ``limit`` at most: a live tail (a restart repeats steps, ids
    never repeat; ``metrics`` thins by step)."""
    stmt = select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.id > after_id).order_by(JobMetric.id)
    return db.scalars(stmt.limit(limit)).all()


def count_by_state(db: Session) -> dict[str, int]:
    return dict(db.execute(select(Job.state, func.count()).group_by(Job.state)).tuples().all())


def is_best_effort_share(placement: Sequence[Mapping[str, Any]] | None) -> bool:
    """An attempt placed as a best-effort GPU share (a preemptible class's fraction of a GPU: ``share.guaranteed``
    false). MPS gives such a share what its neighbours leave, so no step time is promised to it and the SLA's
    step-time term is not measured on it."""
    return any((node.get("share") or {}).get("guaranteed") is False for node in placement or [])


def best_effort_shares(db: Session, job_ids: Sequence[int]) -> set[int]:
    """Those of ``job_ids`` that ran as a best-effort GPU share (``is_best_effort_share``)."""
    out: set[int] = set()
    for start in range(0, len(job_ids), 1000):
        chunk = job_ids[start : start + 1000]
        for job_id, placement in db.execute(select(Attempt.job_id, Attempt.placement).where(Attempt.job_id.in_(chunk))):
            if is_best_effort_share(placement):
                out.add(job_id)
    return out


def has_event_of_attempt(db: Session, job_id: int, type_: str, attempt_id: int) -> bool:
    """Whether the job's timeline has an event of ``type_`` whose data names ``attempt_id``."""
    stmt = select(Event.data).where(Event.job_id == job_id, Event.type == type_)
    return any((data or {}).get("attempt_id") == attempt_id for data in db.scalars(stmt))


def event_types_of(db: Session, job_id: int, types: Sequence[str]) -> set[str]:
    """Which of ``types`` the job's timeline has."""
    return set(db.scalars(select(Event.type).where(Event.job_id == job_id, Event.type.in_(types)).distinct()).all())
