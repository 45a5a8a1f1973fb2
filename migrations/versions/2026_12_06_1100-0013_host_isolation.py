"""hosts.isolation and isolation_note: whether a host's worker sandboxes attempts (workers/isolation.py)

A host registered before this revision has no value (NULL) until its worker starts again: the scheduler treats it
as unable to run a team's own code.

Revision ID: 0013_host_isolation
Revises: 0012_token_parent
Create Date: 2026-12-06 11:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_host_isolation"
down_revision: str | None = "0012_token_parent"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(
            sa.Column(
                "isolation",
                sa.String(length=16),
                nullable=True,
                comment="sandbox, none (turned off), unavailable (runs kiln's own recipes only); NULL: not said yet",
            )
        )
        batch.add_column(
            sa.Column("isolation_note", sa.String(length=512), nullable=True, comment="how, or why not, in words")
        )


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("isolation_note")
        batch.drop_column("isolation")
