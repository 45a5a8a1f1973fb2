"""what users expect around a job: idempotent submissions, versions for ETags, dependency conditions, sweeps

Revision ID: 0005_surface
Revises: 0005_mps
Create Date: 2026-12-01 09:11:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import core.db

revision: str = "0005_surface"
down_revision: str | None = "0005_mps"  # chained after main's MPS migration (both began at 0004_security)
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("parameters", JSON, nullable=False, comment="the grid or list it expanded, as submitted"),
        sa.Column("max_concurrent", sa.Integer(), nullable=True, comment="at most this many of its jobs run at once"),
        sa.Column("created_at", core.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_sweeps_team_id_teams"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_sweeps_user_id_users"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sweeps_team_id"), ["team_id"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "idempotency_key", sa.String(length=128), nullable=True, comment="the submission's Idempotency-Key"
            )
        )
        batch_op.add_column(
            sa.Column(
                "request_sha256", sa.String(length=64), nullable=True, comment="the keyed submission's body, hashed"
            )
        )
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_jobs_team_id_idempotency_key"), ["team_id", "idempotency_key"])
        batch_op.create_index(batch_op.f("ix_jobs_sweep_id"), ["sweep_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_jobs_sweep_id_sweeps"), "sweeps", ["sweep_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("job_dependencies", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "condition",
                sa.String(length=16),
                server_default=sa.text("'afterok'"),
                nullable=False,
                comment="afterok (the other succeeded), afterany (it ended), afternotok (it failed or was cancelled)",
            )
        )
    _describe_requirements()
    for table, what in (("teams", "the team's settings"), ("sla_contracts", "the contract")):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column(
                    "version",
                    sa.Integer(),
                    server_default=sa.text("1"),
                    nullable=False,
                    comment=f"bumped by every change: the ETag of {what}",
                )
            )


# Descriptions that cite a document users do not have ("seed 004's Gold") say the requirement instead; 0003 did so
# only for classes still at their first caps.
DESCRIPTIONS = {
    "gold": "Never preempted by a lower class; the shortest queue-wait objective",
    "silver": "Never preempted by a lower class; the default class",
}


def _describe_requirements() -> None:
    for name, description in DESCRIPTIONS.items():
        op.execute(
            sa.text(
                "UPDATE qos_classes SET description = :d WHERE name = :n AND lower(description) LIKE '%seed 0%'"
            ).bindparams(d=description, n=name)
        )


def downgrade() -> None:
    for table in ("sla_contracts", "teams"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("version")
    with op.batch_alter_table("job_dependencies", schema=None) as batch_op:
        batch_op.drop_column("condition")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_jobs_sweep_id_sweeps"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_jobs_sweep_id"))
        batch_op.drop_constraint(batch_op.f("uq_jobs_team_id_idempotency_key"), type_="unique")
        batch_op.drop_column("sweep_id")
        batch_op.drop_column("request_sha256")
        batch_op.drop_column("idempotency_key")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sweeps_team_id"))
    op.drop_table("sweeps")
