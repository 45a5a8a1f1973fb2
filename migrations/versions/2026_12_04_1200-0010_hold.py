"""jobs.held_at, jobs.held_s and jobs.held_by_admin: a job can be held (kiln hold) and released

A held job stays QUEUED with the pending reason ``Held``; the scheduler leaves it out of its snapshot and its wait
is paused: the queue-wait SLA and the policy's aging count only the time it could have started. A team admin's
hold is released only by a team admin (Slurm's admin hold).

Revision ID: 0010_hold
Revises: 0009_deployment
Create Date: 2026-12-04 12:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0010_hold"
down_revision: str | None = "0009_deployment"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "held_at", core.db.UTCDateTime(timezone=True), nullable=True, comment="held since (NULL: not held)"
            )
        )
        batch.add_column(
            sa.Column(
                "held_s",
                sa.Float(),
                server_default=sa.text("0"),
                nullable=False,
                comment="seconds held in the holds that ended",
            )
        )
        batch.add_column(
            sa.Column(
                "held_by_admin",
                sa.Boolean(),
                server_default=sa.false(),
                nullable=False,
                comment="the hold is a team admin's: only a team admin releases it",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("held_by_admin")
        batch.drop_column("held_s")
        batch.drop_column("held_at")
