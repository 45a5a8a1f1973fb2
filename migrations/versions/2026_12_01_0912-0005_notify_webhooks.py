"""webhooks (per team or per job) and their outbox of deliveries; checkpoint export requests

Revision ID: 0005_notify
Revises: 0005_surface
Create Date: 2026-12-01 09:11:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0005_notify"
down_revision: str | None = "0005_surface"  # after the surface migration (both began at 0005_mps)
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True, comment="NULL: every job of the team"),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column(
            "events", core.db.JSONType, nullable=False, comment="the event kinds it wants: finished, failed, ..."
        ),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("description", sa.String(length=256), nullable=False),
        sa.Column("created_by_user_id", sa.Integer(), nullable=True),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("format IN ('json', 'slack')", name=op.f("ck_webhooks_format_known")),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"], ["users.id"], name=op.f("fk_webhooks_created_by_user_id_users"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_webhooks_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_webhooks_team_id_teams"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index("ix_webhooks_team_id_job_id", "webhooks", ["team_id", "job_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False, comment="finished, failed, preempted, ..."),
        sa.Column("payload", core.db.JSONType, nullable=False, comment="the JSON body's content, fixed when enqueued"),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_attempt_at", core.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", core.db.UTCDateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')", name=op.f("ck_webhook_deliveries_status_known")
        ),
        sa.ForeignKeyConstraint(
            ["event_id"], ["events.id"], name=op.f("fk_webhook_deliveries_event_id_events"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["webhook_id"], ["webhooks.id"], name=op.f("fk_webhook_deliveries_webhook_id_webhooks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index("ix_webhook_deliveries_webhook_id_status_id", "webhook_deliveries", ["webhook_id", "status", "id"])
    op.create_index("ix_webhook_deliveries_status_next_attempt_at", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_table(
        "checkpoint_exports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False, comment="requested, running, ready, failed"),
        sa.Column("requested_by_user_id", sa.Integer(), nullable=True),
        sa.Column("requested_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=128), nullable=True, comment="the worker converting it"),
        sa.Column("claimed_at", core.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", core.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("error", sa.String(length=1024), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoint_exports_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["requested_by_user_id"],
            ["users.id"],
            name=op.f("fk_checkpoint_exports_requested_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoint_exports")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_checkpoint_exports_job_id_step")),
    )
    op.create_index("ix_checkpoint_exports_state_id", "checkpoint_exports", ["state", "id"])


def downgrade() -> None:
    op.drop_table("checkpoint_exports")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
