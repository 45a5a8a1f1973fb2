"""sweeps.search, sweeps.closed_at and sweeps.closed_reason: adaptive sweeps (search: tpe)

A sweep with ``search: tpe`` starts with a few random draws; the scheduler proposes its next jobs from the ones that
ended (``core.services.sweep_search``) until it has its count, it is cancelled, or a proposal cannot be submitted
(then ``closed_at`` and ``closed_reason`` say so).

Revision ID: 0011_sweep_search
Revises: 0010_hold
Create Date: 2026-12-05 02:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0011_sweep_search"
down_revision: str | None = "0010_hold"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(
            sa.Column(
                "search", sa.String(length=16), nullable=True, comment="tpe: its next jobs are proposed as others end"
            )
        )
        batch.add_column(
            sa.Column(
                "closed_at",
                core.db.UTCDateTime(timezone=True),
                nullable=True,
                comment="its search proposes no more jobs since",
            )
        )
        batch.add_column(
            sa.Column(
                "closed_reason", sa.String(length=512), nullable=True, comment="why its search proposes no more jobs"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("closed_reason")
        batch.drop_column("closed_at")
        batch.drop_column("search")
