"""jobs.queued_s and jobs.wait_started_at: the queue wait counts every wait, the first and each requeue

Before, the queue wait was measured from submission to the latest admission, so a job preempted (or requeued
after a lost host) and admitted again was charged its run time as a wait. The upgrade rebuilds each job's waits
from its timeline (submission, then every QUEUED and ADMITTED event, and the end of a wait by a terminal state).

Revision ID: 0008_queue_wait
Revises: 0007_datasets
Create Date: 2026-12-03 16:00:00+00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0008_queue_wait"
down_revision: str | None = "0007_datasets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _aware(value: datetime | str | None) -> datetime | None:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "queued_s",
                sa.Float(),
                server_default=sa.text("0"),
                nullable=False,
                comment="seconds queued in the waits that ended",
            )
        )
        batch.add_column(
            sa.Column(
                "wait_started_at",
                core.db.UTCDateTime(timezone=True),
                nullable=True,
                comment="when the current wait after a requeue began (backoff excluded); NULL "
                "before the first admission",
            )
        )
        batch.alter_column(
            "admitted_at",
            existing_type=core.db.UTCDateTime(timezone=True),
            existing_nullable=True,
            comment="the latest admission",
        )
    bind = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer),
        sa.column("submitted_at", core.db.UTCDateTime()),
        sa.column("queued_s", sa.Float),
        sa.column("wait_started_at", core.db.UTCDateTime()),
    )
    events = sa.table(
        "events",
        sa.column("id", sa.Integer),
        sa.column("job_id", sa.Integer),
        sa.column("type", sa.String),
        sa.column("data", sa.JSON),
        sa.column("created_at", core.db.UTCDateTime()),
    )
    started = {jid: _aware(at) for jid, at in bind.execute(sa.select(jobs.c.id, jobs.c.submitted_at))}
    waits: dict[int, tuple[float, datetime | None]] = {jid: (0.0, at) for jid, at in started.items()}
    timeline = (
        sa.select(events.c.job_id, events.c.type, events.c.data, events.c.created_at)
        .where(events.c.job_id.is_not(None), events.c.type.in_(("QUEUED", "ADMITTED", *TERMINAL)))
        .order_by(events.c.id)
    )
    for jid, type_, data, at in bind.execute(timeline):
        if jid not in waits:
            continue
        total, since = waits[jid]
        at = _aware(at)
        if type_ == "QUEUED":
            begin = _aware((data or {}).get("not_before")) if isinstance(data, dict) else None
            waits[jid] = (total, max(at, begin) if begin is not None else at)
        elif since is not None:
            waits[jid] = (total + max(0.0, (at - since).total_seconds()), None)
    rows = []
    for jid, (total, since) in waits.items():
        resumed = since if since is not None and since != started[jid] else None  # a wait after a requeue
        if total or resumed is not None:
            rows.append({"jid": jid, "queued_s": total, "wait_started_at": resumed})
    if rows:  # one executemany, not a statement per job
        bind.execute(jobs.update().where(jobs.c.id == sa.bindparam("jid")), rows)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("wait_started_at")
        batch.drop_column("queued_s")
        batch.alter_column(
            "admitted_at", existing_type=core.db.UTCDateTime(timezone=True), existing_nullable=True, comment=None
        )
