"""event_outbox: the events deliverer's cursor, and one delivery per hook, event and kind

Webhook deliveries are no longer written with their event: the deliverer (``core.outbox``) reads the events after
its cursor and writes them. The cursor starts after the events already there, whose deliveries were written with
them.

Revision ID: 0018_event_outbox
Revises: 0017_oidc_identity
Create Date: 2026-12-07 03:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0018_event_outbox"
down_revision: str | None = "0017_oidc_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "event_cursors",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.Column("gaps", core.db.JSONType, nullable=False, comment="event ids at or below last_event_id not seen yet"),
        sa.Column("horizon_xid", sa.BigInteger(), nullable=True, comment="pg_snapshot_xmax when the gaps were seen"),
        sa.Column("horizon_event_id", sa.BigInteger(), nullable=True, comment="the gaps up to it wait for horizon_xid"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_event_cursors")),
    )
    op.execute(
        "INSERT INTO event_cursors (name, last_event_id, gaps, updated_at) "
        "SELECT 'webhooks', COALESCE(MAX(id), 0), '[]', CURRENT_TIMESTAMP FROM events"
    )
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.create_unique_constraint(
            batch.f("uq_webhook_deliveries_webhook_id_event_id_kind"), ["webhook_id", "event_id", "kind"]
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.drop_constraint(batch.f("uq_webhook_deliveries_webhook_id_event_id_kind"), type_="unique")
    op.drop_table("event_cursors")
