"""deployment: one row naming this database (a random uid)

A job's number is unique in one database only. Directories that outlive a database or are shared by several (a
host's fast local checkpoint tier, ``/dev/shm/kiln`` by default; a storage directory kept when the database was
recreated) held a job's files under its number alone, so a new database's job 1 resumed from another database's
job 1's checkpoint. The local tier now keeps each database's jobs under its uid, and the storage directory is
claimed by one uid (``core.deployment``).

Revision ID: 0009_deployment
Revises: 0008_queue_wait
Create Date: 2026-12-03 19:00:00+00:00
"""

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0009_deployment"
down_revision: str | None = "0008_queue_wait"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "deployment",
        sa.Column("id", sa.Integer(), nullable=False, comment="always 1: one row"),
        sa.Column("uid", sa.String(length=32), nullable=False, comment="random, hex"),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment")),
    )
    op.bulk_insert(table, [{"id": 1, "uid": secrets.token_hex(16), "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    # The uid goes with the table: upgraded again, the database gets a new one, and the storage directory's
    # DEPLOYMENT file (which names the old) must be rewritten with it before kiln starts on that storage again.
    op.drop_table("deployment")
