"""jobs: a partial index of the unfinished jobs by team, for the count every submission makes (the team's cap)

Revision ID: 0014_jobs_unfinished_index
Revises: 0013_host_isolation
Create Date: 2026-12-06 21:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_jobs_unfinished_index"
down_revision: str | None = "0013_host_isolation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The states as they were when this revision was written (core.states.UNFINISHED): a migration does not follow code.
UNFINISHED = sa.text("state IN ('ADMITTED', 'LOST', 'PAUSED', 'PREEMPTING', 'QUEUED', 'RUNNING')")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_team_id_unfinished", "jobs", ["team_id"], postgresql_where=UNFINISHED, sqlite_where=UNFINISHED
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_team_id_unfinished", table_name="jobs")
