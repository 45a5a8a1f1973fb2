"""GPU sharing: each host's MPS daemon state

Revision ID: 0005_mps
Revises: 0004_security
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_mps"
down_revision: str | None = "0004_security"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(
            sa.Column(
                "mps",
                sa.String(length=16),
                nullable=True,
                comment="its MPS daemon: running, restarting, failed; NULL: none (workers/mps.py)",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("mps")
