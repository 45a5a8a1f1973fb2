"""scheduler_lease: the schedulers' leadership as a lease with a term (a frozen leader loses it)

Revision ID: 0015_scheduler_lease
Revises: 0014_jobs_unfinished_index
Create Date: 2026-12-06 22:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_scheduler_lease"
down_revision: str | None = "0014_jobs_unfinished_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_lease",
        sa.Column("id", sa.Integer(), nullable=False, comment="always 1: one row"),
        sa.Column("holder", sa.String(length=160), nullable=False, comment="host:pid:random of the leading process"),
        sa.Column("term", sa.BigInteger(), nullable=False, comment="raised by one at each takeover"),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "watched_since",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="since when some leader renewed without a gap: the reconciler's grace counts from it",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduler_lease")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_lease")
