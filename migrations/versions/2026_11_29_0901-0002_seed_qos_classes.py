"""seed the four QoS classes (the figures kiln first shipped with; a deployment edits them through the API)

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GB = 10**9
QOS = sa.table(
    "qos_classes",
    sa.column("name", sa.String),
    sa.column("priority", sa.Integer),
    sa.column("preemptible", sa.Boolean),
    sa.column("gpu_memory_cap_bytes", sa.BigInteger),
    sa.column("sm_percent", sa.Integer),
    sa.column("pcie_bandwidth_bytes_per_s", sa.BigInteger),
    sa.column("nvlink_bandwidth_bytes_per_s", sa.BigInteger),
    sa.column("default_max_queue_wait_s", sa.Float),
    sa.column("description", sa.String),
)


def upgrade() -> None:
    # Written out here, not imported from core.seed: a migration must not change when the code does.
    op.bulk_insert(
        QOS,
        [
            dict(
                name="gold",
                priority=1000,
                preemptible=False,
                gpu_memory_cap_bytes=8 * GB,
                sm_percent=100,
                pcie_bandwidth_bytes_per_s=32 * GB,
                nvlink_bandwidth_bytes_per_s=None,
                default_max_queue_wait_s=300.0,
                description="Never preempted by a lower class; seed 004's Gold: 8 GB, 100% SM, 32 GB/s",
            ),
            dict(
                name="silver",
                priority=500,
                preemptible=False,
                gpu_memory_cap_bytes=4 * GB,
                sm_percent=60,
                pcie_bandwidth_bytes_per_s=16 * GB,
                nvlink_bandwidth_bytes_per_s=None,
                default_max_queue_wait_s=1800.0,
                description="Seed 004's Silver: 4 GB, 60% SM, 16 GB/s",
            ),
            dict(
                name="bronze",
                priority=200,
                preemptible=True,
                gpu_memory_cap_bytes=None,
                sm_percent=100,
                pcie_bandwidth_bytes_per_s=8 * GB,
                nvlink_bandwidth_bytes_per_s=None,
                default_max_queue_wait_s=7200.0,
                description="Preemptible by gold and silver; checkpoints before it stops",
            ),
            dict(
                name="best-effort",
                priority=0,
                preemptible=True,
                gpu_memory_cap_bytes=None,
                sm_percent=100,
                pcie_bandwidth_bytes_per_s=8 * GB,
                nvlink_bandwidth_bytes_per_s=None,
                default_max_queue_wait_s=None,
                description="Runs on idle capacity; throttled or preempted first",
            ),
        ],
    )


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM qos_classes WHERE name IN ('gold', 'silver', 'bronze', 'best-effort')"))
