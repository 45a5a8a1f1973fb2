"""a team's registered datasets: name -> a directory of the storage root's data area

Revision ID: 0007_datasets
Revises: 0005_usercode
Create Date: 2026-12-01 09:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0007_datasets"
down_revision: str | None = "0005_usercode"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column(
            "path", sa.String(length=1024), nullable=False, comment="relative to the storage root, under datasets/"
        ),
        sa.Column("description", sa.String(length=256), nullable=True),
        sa.Column("created_by_user_id", sa.Integer(), nullable=True),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_datasets_team_id_teams"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_datasets_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("team_id", "name", name=op.f("uq_datasets_team_id_name")),
    )


def downgrade() -> None:
    op.drop_table("datasets")
