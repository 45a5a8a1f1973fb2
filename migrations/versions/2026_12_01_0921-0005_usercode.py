"""a team's own code: the artifacts table (archives by SHA-256), the job's code digest and last evaluation

Revision ID: 0005_usercode
Revises: 0006_host_unreachable
Create Date: 2026-12-01 09:13:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import core.db

revision: str = "0005_usercode"
down_revision: str | None = "0006_host_unreachable"  # after main's latest (all began at 0004_security)
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False, comment="SHA-256 of the archive, hex"),
        sa.Column(
            "bytes", sa.BigInteger(), nullable=False, comment="the archive's size, counted against the team's quota"
        ),
        sa.Column("unpacked_bytes", sa.BigInteger(), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.Column("uploaded_by_user_id", sa.Integer(), nullable=True),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column(
            "last_used_at",
            core.db.UTCDateTime(timezone=True),
            nullable=False,
            comment="upload or the last submit naming it",
        ),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_artifacts_team_id_teams"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["uploaded_by_user_id"],
            ["users.id"],
            name=op.f("fk_artifacts_uploaded_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("team_id", "digest", name=op.f("uq_artifacts_team_id_digest")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("code_digest", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column(
                "eval_metrics",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )
        batch_op.create_index("ix_jobs_team_id_code_digest", ["team_id", "code_digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_team_id_code_digest")
        batch_op.drop_column("eval_metrics")
        batch_op.drop_column("code_digest")
    op.drop_table("artifacts")
