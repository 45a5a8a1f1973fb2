"""forecasts: what kiln forecast per job (start, peak memory, step time, GPU-hours) and what then happened

Revision ID: 0016_forecasts
Revises: 0015_scheduler_lease
Create Date: 2026-12-07 01:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_forecasts"
down_revision: str | None = "0015_scheduler_lease"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNSETTLED = sa.text("settled_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "forecasts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column(
            "kind", sa.String(length=16), nullable=False, comment="start_time, peak_memory, step_time, gpu_hours"
        ),
        sa.Column(
            "source",
            sa.String(length=16),
            nullable=False,
            comment="who forecast it: scheduler, submit, trainer, estimate",
        ),
        sa.Column("predicted", sa.Float(), nullable=True, comment="NULL: kiln said it cannot be known (note says why)"),
        sa.Column("predicted_high", sa.Float(), nullable=True, comment="the top of a range (a start's latest)"),
        sa.Column("actual", sa.Float(), nullable=True, comment="as measured; NULL once settled: it never happened"),
        sa.Column("note", sa.String(length=512), nullable=True, comment="how it was forecast, or why it could not be"),
        sa.Column("made_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "settled_at", sa.DateTime(timezone=True), nullable=True, comment="when the measured value became known"
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_forecasts_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_forecasts_team_id_teams"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_forecasts")),
        sa.UniqueConstraint("job_id", "kind", "source", name=op.f("uq_forecasts_job_id_kind_source")),
    )
    op.create_index(
        "ix_forecasts_unsettled", "forecasts", ["job_id"], postgresql_where=UNSETTLED, sqlite_where=UNSETTLED
    )
    op.create_index("ix_forecasts_team_id_made_at", "forecasts", ["team_id", "made_at"])


def downgrade() -> None:
    op.drop_index("ix_forecasts_team_id_made_at", table_name="forecasts")
    op.drop_index("ix_forecasts_unsettled", table_name="forecasts")
    op.drop_table("forecasts")
