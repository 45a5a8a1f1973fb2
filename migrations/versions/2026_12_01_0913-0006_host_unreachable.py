"""hosts.state may be UNREACHABLE: heartbeating, but its Celery consumer consumes nothing

Revision ID: 0006_host_unreachable
Revises: 0005_notify
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_host_unreachable"
down_revision: str | None = "0005_notify"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.alter_column(
            "state",
            existing_type=sa.String(length=16),
            existing_nullable=False,
            comment="UP, UNREACHABLE, DOWN, EXCLUDED",
        )


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.alter_column(
            "state", existing_type=sa.String(length=16), existing_nullable=False, comment="UP, DOWN, EXCLUDED"
        )
