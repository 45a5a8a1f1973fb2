"""the GPU path: NVML's name beside the GPU type, submit-time memory predictions, kiln's own overhead per step,
and QoS classes that do not cap a whole GPU

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GB = 10**9
QOS = sa.table(
    "qos_classes",
    sa.column("name", sa.String),
    sa.column("gpu_memory_cap_bytes", sa.BigInteger),
    sa.column("sm_percent", sa.Integer),
    sa.column("description", sa.String),
)
# (name, cap and SM share as first seeded, as now, description now). Only rows still holding the first seed's
# values change: a class an admin edited stays as the admin left it.
SEEDED = [
    ("gold", 8 * GB, 100, None, 100, "Never preempted by a lower class; the shortest queue-wait objective"),
    ("silver", 4 * GB, 60, None, 100, "Never preempted by a lower class; the default class"),
]


def upgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("name", sa.String(length=128), nullable=True, comment="NVML's name"))
        batch.alter_column("model", existing_type=sa.String(length=128), comment="GPU type, e.g. H200")
    op.execute(sa.text("UPDATE gpus SET name = model"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("predicted_memory_bytes", sa.BigInteger(), nullable=True, comment="peak GPU bytes per rank")
        )
    with op.batch_alter_table("job_metrics") as batch:
        batch.add_column(
            sa.Column("overhead", sa.String(length=32), nullable=True, comment="kiln's own work during the step")
        )
    for name, old_cap, old_sm, cap, sm, description in SEEDED:
        op.execute(
            QOS.update()
            .where(QOS.c.name == name, QOS.c.gpu_memory_cap_bytes == old_cap, QOS.c.sm_percent == old_sm)
            .values(gpu_memory_cap_bytes=cap, sm_percent=sm, description=description)
        )
    for name, description in [
        ("bronze", "Preemptible by gold and silver; checkpoints before it stops"),
        ("best-effort", "Runs on idle capacity; preempted first"),
    ]:
        op.execute(QOS.update().where(QOS.c.name == name).values(description=description))


def downgrade() -> None:
    for name, old_cap, old_sm, _, sm, _ in SEEDED:
        op.execute(
            QOS.update()
            .where(QOS.c.name == name, QOS.c.gpu_memory_cap_bytes.is_(None), QOS.c.sm_percent == sm)
            .values(gpu_memory_cap_bytes=old_cap, sm_percent=old_sm)
        )
    with op.batch_alter_table("job_metrics") as batch:
        batch.drop_column("overhead")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("predicted_memory_bytes")
    with op.batch_alter_table("gpus") as batch:
        batch.alter_column("model", existing_type=sa.String(length=128), comment=None)
        batch.drop_column("name")
