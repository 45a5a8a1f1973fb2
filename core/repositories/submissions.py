"""A submission's write: the job, its dependencies, its effective contract and its SUBMITTED event, in one statement
on PostgreSQL, with a place under the team's cap on its unfinished jobs (``teams.unfinished_bound``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from core.models import Event, Job, JobDependency, SlaContract
from core.repositories.jobs import count_unfinished
from core.states import UNFINISHED

# A submission on PostgreSQL: a place under the team's cap, the job, its dependencies, its effective contract, its
# SUBMITTED event and the scheduler's wake-up, in one statement (one round trip). Every value is written explicitly
# (no ORM defaults run). The place: ``teams.unfinished_bound`` (SLOT) is at least the team's unfinished jobs, since
# every job is inserted here with it raised by one under the team's row lock (the UPDATE's), and a job that ends
# leaves it as it is (it only lowers the true count). So bound < cap proves there is room without counting; when it
# does not (unknown, or at the cap), RECOUNT_SLOT counts the jobs in a statement that runs after the lock is held,
# so it sees every job the team's earlier submissions committed, and stores the exact count.
_SUBMIT_PG = """
WITH slot AS (
    SLOT
), job AS (
    INSERT INTO jobs (name, team_id, user_id, spec, state, qos_class_id, priority, gpus, gpu_type,
                      predicted_memory_bytes, restart_count, fencing_token, cancel_requested, preempt_requested,
                      last_step, submitted_at, updated_at, idempotency_key, request_sha256, sweep_id,
                      code_digest, held_at, held_by_admin, pending_reason, pending_message)
    SELECT :name, :team_id, :user_id, CAST(:spec AS JSONB), :state, :qos_class_id, :priority, :gpus, :gpu_type,
           :predicted_memory_bytes, :restart_count, :fencing_token, :cancel_requested, :preempt_requested,
           :last_step, :submitted_at, :updated_at, :idempotency_key, :request_sha256, :sweep_id,
           :code_digest, :held_at, :held_by_admin, :pending_reason, :pending_message
    FROM slot
    RETURNING id
), deps AS (
    INSERT INTO job_dependencies (job_id, depends_on_id, condition)
    SELECT job.id, d.dep, d.cond FROM job,
           unnest(CAST(:depends_on AS BIGINT[]), CAST(:dep_conditions AS VARCHAR[])) AS d(dep, cond)
), sla AS (
    INSERT INTO sla_contracts (team_id, job_id, qos_class_id, max_queue_wait_s, deadline, max_restarts,
                               recovery_time_objective_s, checkpoint_interval_s, min_checkpoint_success_rate,
                               step_time_tolerance, created_at, updated_at)
    SELECT :team_id, job.id, :qos_class_id, :max_queue_wait_s, :deadline, :max_restarts,
           :recovery_time_objective_s, :checkpoint_interval_s, :min_checkpoint_success_rate, :step_time_tolerance,
           :submitted_at, :submitted_at FROM job
), ev AS (
    INSERT INTO events (job_id, team_id, actor_user_id, type, message, data, created_at)
    SELECT job.id, :team_id, :user_id, :event_type, :event_message, CAST(:event_data AS JSONB), :submitted_at
    FROM job
)
SELECT job.id, pg_notify(:channel, CAST(job.id AS TEXT))ASYNC FROM job
"""
_SLOT = """UPDATE teams SET unfinished_bound = unfinished_bound + 1
    WHERE id = :team_id AND unfinished_bound < :max_unfinished RETURNING id"""
# Counts at most the cap's worth of jobs (the partial index ix_jobs_team_id_unfinished): all it needs to know.
_RECOUNT_SLOT = """UPDATE teams SET unfinished_bound = counted.n + 1
    FROM (SELECT count(*) AS n FROM (SELECT 1 FROM jobs WHERE team_id = :team_id AND state IN (UNFINISHED)
                                     LIMIT :max_unfinished) AS u) AS counted
    WHERE id = :team_id AND counted.n < :max_unfinished RETURNING id"""


def _driver_sql(sql: str) -> str:
    """Run as driver SQL (psycopg's %(name)s placeholders): no bind processing or compiled-cache lookup."""
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql.replace("UNFINISHED", ", ".join(f"'{s}'" for s in UNFINISHED)))


def _submit_sql(slot: str, *, commit_async: bool = False) -> str:
    return _driver_sql(
        _SUBMIT_PG.replace("SLOT", slot, 1).replace(
            "ASYNC", ", set_config('synchronous_commit', 'off', true)" if commit_async else "", 1
        )
    )


_SUBMIT_PG_SQL = _submit_sql(_SLOT)
_SUBMIT_RECOUNT_PG_SQL = _submit_sql(_RECOUNT_SLOT)
_LOCK_TEAM_PG_SQL = "SELECT id FROM teams WHERE id = %(team_id)s FOR NO KEY UPDATE"
# In autocommit (the API's submit) the write commits on its own without waiting for the WAL's flush: the team's row
# lock ends with the commit, and held through a flush (2-3 ms on this machine's disk) it let one team's submissions
# through one at a time: 32 at once made 574 a second against 1,998 without waiting
# (bench/team_lock_probe.py, bench/results/api_bench_team_lock.json).
# DURABLE then changes the new job's row in a transaction of its own, committed as usual: that commit flushes the
# WAL up to its own record, past the write's, so the job is on disk before the API answers 201.
_SUBMIT_ASYNC_PG_SQL = _submit_sql(_SLOT, commit_async=True)
_DURABLE_PG_SQL = "UPDATE jobs SET updated_at = updated_at WHERE id = %(id)s"


def insert_submitted(
    db: Session,
    *,
    job: Mapping[str, Any],
    spec_json: str,
    depends_on: Sequence[tuple[int, str]],
    contract: Mapping[str, Any],
    event_type: str,
    event_message: str,
    event_data: Mapping[str, Any],
    channel: str,
    max_unfinished: int | None = None,
) -> int | None:
    """Write a submission: the job (``job`` holds every NOT NULL column of ``jobs``; ``spec_json`` is its spec,
    serialized), its dependencies ((job id, condition) pairs), its effective contract, its event; returns the new
    id, or None, writing nothing, when the team has ``max_unfinished`` unfinished jobs already, however many
    submissions run at once. PostgreSQL: one statement (``_SUBMIT_PG``, which takes the team's row lock and a place
    under the cap without counting), whose ``NOTIFY channel, '<id>'`` is sent when the transaction commits, and in
    autocommit one more that makes it durable (``_submit_pg``); two more when the team's bound is unknown or at the
    cap (``_submit_counting``). Elsewhere (SQLite, which has no NOTIFY, and writes one transaction at a time) a
    count, then the same rows, one insert each."""
    limit = max_unfinished if max_unfinished is not None else 2**62
    params = {
        **job,
        "spec": spec_json,
        "depends_on": [d for d, _ in depends_on],
        "dep_conditions": [c for _, c in depends_on],
        **contract,
        "event_type": event_type,
        "event_message": event_message,
        "event_data": json.dumps(event_data),
        "channel": channel,
        "max_unfinished": limit,
    }
    conn = db.connection()
    if conn.dialect.name == "postgresql":
        return _submit_pg(conn, params)
    if count_unfinished(db, job["team_id"]) >= limit:
        return None
    created = job["submitted_at"]
    job_id = conn.execute(insert(Job).values(**job).returning(Job.id)).scalar_one()
    if depends_on:
        conn.execute(
            insert(JobDependency),
            [{"job_id": job_id, "depends_on_id": dep, "condition": cond} for dep, cond in depends_on],
        )
    conn.execute(
        insert(SlaContract).values(
            team_id=job["team_id"],
            job_id=job_id,
            qos_class_id=job["qos_class_id"],
            created_at=created,
            updated_at=created,
            **contract,
        )
    )
    conn.execute(
        insert(Event).values(
            job_id=job_id,
            team_id=job["team_id"],
            actor_user_id=job["user_id"],
            type=event_type,
            message=event_message,
            data=dict(event_data),
            created_at=created,
        )
    )
    return job_id


def _submit_pg(conn: Connection, params: Mapping[str, Any]) -> int | None:
    """One statement when the team's bound proves room; in autocommit, committed without waiting for the WAL's
    flush, then made durable (``_DURABLE_PG_SQL``) once the team's row is free. Inside a caller's transaction the
    caller's commit is the durable one."""
    driver = conn.connection.driver_connection
    assert driver is not None, "a live connection"
    if not driver.autocommit:
        written: int | None = conn.exec_driver_sql(_SUBMIT_PG_SQL, params).scalar()
        return written if written is not None else _submit_counting(conn, params)
    written = conn.exec_driver_sql(_SUBMIT_ASYNC_PG_SQL, params).scalar()
    if written is None:
        return _submit_counting(conn, params)
    conn.exec_driver_sql(_DURABLE_PG_SQL, {"id": written})
    return written


def _submit_counting(conn: Connection, params: Mapping[str, Any]) -> int | None:
    """The submission when the team's bound proves no room (unknown, or at the cap): lock the team's row, then, in
    a statement of its own (whose snapshot is taken after the lock is held), count its unfinished jobs, store the
    count and write the job if it is under the cap. One transaction: the API's submit runs in autocommit
    (``api.deps.autocommit``), where the lock would end with its own statement; inside a caller's transaction the
    lock is held until it ends, as the fast path's."""
    driver = conn.connection.driver_connection
    assert driver is not None, "a live connection"
    with driver.transaction() if driver.autocommit else nullcontext():
        conn.exec_driver_sql(_LOCK_TEAM_PG_SQL, params)
        written: int | None = conn.exec_driver_sql(_SUBMIT_RECOUNT_PG_SQL, params).scalar()
    return written
