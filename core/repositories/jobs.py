"""Jobs and what hangs off them: events, attempts, checkpoints, metrics, dependencies, effective contracts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, Select, func, select, text
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


# A submission on PostgreSQL: the job, its dependencies, its effective contract, its SUBMITTED event and the
# scheduler's wake-up, in one statement (one round trip). Every value is written explicitly (no ORM defaults run).
_SUBMIT_PG = text("""
WITH job AS (
    INSERT INTO jobs (name, team_id, user_id, spec, state, qos_class_id, priority, gpus, gpu_type,
                      predicted_memory_bytes, restart_count, fencing_token, cancel_requested, preempt_requested,
                      last_step, submitted_at, updated_at)
    VALUES (:name, :team_id, :user_id, CAST(:spec AS JSONB), :state, :qos_class_id, :priority, :gpus, :gpu_type,
            :predicted_memory_bytes, :restart_count, :fencing_token, :cancel_requested, :preempt_requested,
            :last_step, :submitted_at, :updated_at)
    RETURNING id
), deps AS (
    INSERT INTO job_dependencies (job_id, depends_on_id)
    SELECT job.id, dep FROM job, unnest(CAST(:depends_on AS BIGINT[])) AS dep
), sla AS (
    INSERT INTO sla_contracts (team_id, job_id, qos_class_id, max_queue_wait_s, deadline, max_restarts,
                               recovery_time_objective_s, checkpoint_interval_s, min_checkpoint_success_rate,
                               step_time_tolerance, created_at, updated_at)
    VALUES (:team_id, (SELECT id FROM job), :qos_class_id, :max_queue_wait_s, :deadline, :max_restarts,
            :recovery_time_objective_s, :checkpoint_interval_s, :min_checkpoint_success_rate, :step_time_tolerance,
            :submitted_at, :submitted_at)
), ev AS (
    INSERT INTO events (job_id, team_id, actor_user_id, type, message, data, created_at)
    VALUES ((SELECT id FROM job), :team_id, :user_id, :event_type, :event_message, CAST(:event_data AS JSONB),
            :submitted_at)
)
SELECT job.id, pg_notify(:channel, CAST(job.id AS TEXT)) FROM job
""")
# Run as driver SQL (psycopg's %(name)s placeholders): no bind processing or compiled-cache lookup per submission.
_SUBMIT_PG_SQL = re.sub(r"(?<!:):(\w+)", r"%(\1)s", _SUBMIT_PG.text)


def insert_submitted_pg(
    db: Session, *, job: Mapping[str, Any], depends_on: Sequence[int], contract: Mapping[str, Any],
    event_type: str, event_message: str, event_data: Mapping[str, Any], channel: str, spec_json: str | None = None,
) -> int:  # fmt: skip
    """PostgreSQL only: ``job`` holds every NOT NULL column of ``jobs`` (``_SUBMIT_PG``); returns the new id.
    ``spec_json``: ``job["spec"]`` already serialized, if the caller has it. ``NOTIFY channel, '<id>'`` is sent
    when the transaction commits."""
    params = {
        **job, "spec": spec_json if spec_json is not None else json.dumps(job["spec"]),
        "depends_on": list(depends_on), **contract,
        "event_type": event_type, "event_message": event_message, "event_data": json.dumps(event_data),
        "channel": channel,
    }  # fmt: skip
    job_id: int = db.connection().exec_driver_sql(_SUBMIT_PG_SQL, params).scalar_one()
    return job_id


def get_row(db: Session, job_id: int) -> JobRow | None:
    return db.execute(_job_select().where(Job.id == job_id)).tuples().one_or_none()


def get(db: Session, job_id: int, *, for_update: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    return db.scalars(stmt).one_or_none()


def list_rows(db: Session, flt: JobFilter, limit: int) -> Sequence[Row[Any]]:
    """Newest first; ``limit`` rows at most (callers ask for one more to know whether a next page exists).
    Plain rows (no ORM identity map): the ``jobs`` columns by name, plus ``team``, ``user`` and ``qos``.

    On PostgreSQL the rows are ``LIST_COLUMNS`` instead (the page's fields in ``JobOut`` order; ``steps`` read
    from the spec; ``spec_json`` the spec as JSON text, not parsed), from ``list_sql_pg``, as driver SQL."""
    conn = db.connection()
    if conn.dialect.name == "postgresql":
        sql, params = list_sql_pg(flt, limit)
        return conn.exec_driver_sql(sql, params).all()
    return conn.execute(list_statement(flt, limit)).all()


# What the PostgreSQL list returns per row, in this order (``JobOut``'s fields, the spec last and as JSON text).
LIST_COLUMNS = (
    "id", "name", "team", "user", "state", "qos", "priority", "gpus", "gpu_type", "pending_reason",
    "pending_message", "restart_count", "last_step", "last_loss", "steps", "exit_reason", "cancel_requested",
    "submitted_at", "admitted_at", "started_at", "finished_at", "spec_json",
)  # fmt: skip
_LIST_PG_SELECT = (
    'SELECT jobs.id, jobs.name, teams.name AS team, users.name AS "user", jobs.state, qos_classes.name AS qos,'
    " jobs.priority, jobs.gpus, jobs.gpu_type, jobs.pending_reason, jobs.pending_message, jobs.restart_count,"
    " jobs.last_step, jobs.last_loss,"
    " CASE WHEN jsonb_typeof(jobs.spec -> 'steps') = 'number'"
    " THEN CAST(trunc(CAST(jobs.spec ->> 'steps' AS NUMERIC)) AS BIGINT) ELSE 0 END AS steps,"
    " jobs.exit_reason, jobs.cancel_requested, jobs.submitted_at, jobs.admitted_at, jobs.started_at,"
    " jobs.finished_at, CAST(jobs.spec AS TEXT) AS spec_json"
    " FROM jobs JOIN teams ON teams.id = jobs.team_id LEFT OUTER JOIN users ON users.id = jobs.user_id"
    " JOIN qos_classes ON qos_classes.id = jobs.qos_class_id"
)


def list_sql_pg(flt: JobFilter, limit: int) -> tuple[str, dict[str, Any]]:
    """``list_statement`` as PostgreSQL SQL text and parameters (no statement to build, cache-key or compile per
    request; the same text for the same filter shape, so psycopg prepares it). Same plan: a backward keyset scan
    of ``ix_jobs_team_id_id`` (or of the primary key) joined with the team, user and QoS names."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if flt.team_ids is not None:
        if flt.team_ids:
            names = [f"t{i}" for i in range(len(flt.team_ids))]
            params.update(zip(names, flt.team_ids, strict=True))
            where.append("jobs.team_id IN (" + ", ".join(f"%({n})s" for n in names) + ")")
        else:
            where.append("false")
    if flt.team_id is not None:
        where.append("jobs.team_id = %(team_id)s")
        params["team_id"] = flt.team_id
    if flt.states:
        names = [f"s{i}" for i in range(len(flt.states))]
        params.update(zip(names, flt.states, strict=True))
        where.append("jobs.state IN (" + ", ".join(f"%({n})s" for n in names) + ")")
    if flt.qos_id is not None:
        where.append("jobs.qos_class_id = %(qos_id)s")
        params["qos_id"] = flt.qos_id
    if flt.name is not None:
        where.append("jobs.name = %(name)s")
        params["name"] = flt.name
    if flt.before_id is not None:
        where.append("jobs.id < %(before_id)s")
        params["before_id"] = flt.before_id
    sql = _LIST_PG_SELECT + (" WHERE " + " AND ".join(where) if where else "")
    return sql + " ORDER BY jobs.id DESC LIMIT %(limit)s", params


UTC_ZONES = frozenset({"UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu"})


def session_is_utc(db: Session) -> bool:
    """Whether the connection's ``TimeZone`` is UTC (PostgreSQL hands timestamptz over in the session's zone; the
    API answers in UTC). No round trip: psycopg keeps the server's parameter status."""
    raw = db.connection().connection.driver_connection
    tz = getattr(getattr(raw, "info", None), "timezone", None)
    return getattr(tz, "key", None) in UTC_ZONES


def list_statement(flt: JobFilter, limit: int) -> Select[Any]:
    """The list query, one statement: a backward keyset scan of ``ix_jobs_team_id_id`` (team filter +
    ``ORDER BY id DESC``) joined with the team, user and QoS names."""
    jobs = Job.__table__
    stmt = (
        select(jobs, Team.name.label("team"), User.name.label("user"), QosClass.name.label("qos"))
        .join(Team, Team.id == jobs.c.team_id)
        .outerjoin(User, User.id == jobs.c.user_id)
        .join(QosClass, QosClass.id == jobs.c.qos_class_id)
    )
    if flt.team_ids is not None:
        stmt = stmt.where(jobs.c.team_id.in_(flt.team_ids))
    if flt.team_id is not None:
        stmt = stmt.where(jobs.c.team_id == flt.team_id)
    if flt.states:
        stmt = stmt.where(jobs.c.state.in_(flt.states))
    if flt.qos_id is not None:
        stmt = stmt.where(jobs.c.qos_class_id == flt.qos_id)
    if flt.name is not None:
        stmt = stmt.where(jobs.c.name == flt.name)
    if flt.before_id is not None:
        stmt = stmt.where(jobs.c.id < flt.before_id)
    return stmt.order_by(jobs.c.id.desc()).limit(limit)


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
