"""the QoS classes and restart limit a team may use (an admin's decision), and team invitations

Existing teams keep what they could use without an admin: silver, bronze and best-effort, plus the class of
their default contract; the ``default`` team (the first admin's own, made by ``kiln up``) gets every class.

Revision ID: 0004_security
Revises: 0003
Create Date: 2026-12-01 09:01:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.db

revision: str = "0004_security"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "team_qos_classes",
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("qos_class_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["qos_class_id"],
            ["qos_classes.id"],
            name=op.f("fk_team_qos_classes_qos_class_id_qos_classes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_team_qos_classes_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("team_id", "qos_class_id", name=op.f("pk_team_qos_classes")),
    )
    op.create_table(
        "team_invitations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("invited_by_user_id", sa.Integer(), nullable=True),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("role IN ('team-admin', 'member', 'viewer')", name=op.f("ck_team_invitations_role_known")),
        sa.ForeignKeyConstraint(
            ["invited_by_user_id"],
            ["users.id"],
            name=op.f("fk_team_invitations_invited_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_team_invitations_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_team_invitations")),
        sa.UniqueConstraint("team_id", "user_name", name=op.f("uq_team_invitations_team_id_user_name")),
    )
    with op.batch_alter_table("team_invitations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_team_invitations_user_name"), ["user_name"], unique=False)
    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "restart_limit",
                sa.Integer(),
                server_default=sa.text("10"),
                nullable=False,
                comment="the most restarts a contract of the team may ask for",
            )
        )
        batch_op.create_check_constraint(batch_op.f("ck_teams_restart_limit_nonneg"), "restart_limit >= 0")
    op.execute(
        sa.text(
            "INSERT INTO team_qos_classes (team_id, qos_class_id)"
            " SELECT t.id, q.id FROM teams t, qos_classes q"
            " WHERE q.name IN ('silver', 'bronze', 'best-effort') OR t.name = 'default'"
            " OR q.id IN (SELECT s.qos_class_id FROM sla_contracts s WHERE s.team_id = t.id AND s.job_id IS NULL)"
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_teams_restart_limit_nonneg"), type_="check")
        batch_op.drop_column("restart_limit")
    with op.batch_alter_table("team_invitations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_team_invitations_user_name"))
    op.drop_table("team_invitations")
    op.drop_table("team_qos_classes")
