"""teams: an upper bound of the team's unfinished jobs, so a submission checks the team's cap without counting them

NULL (every team made before this revision, and on SQLite, which counts): the next submission counts the team's
unfinished jobs and stores the bound (core.repositories.submissions.insert_submitted).

Revision ID: 0019_team_unfinished_bound
Revises: 0018_event_outbox
Create Date: 2026-12-07 04:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_team_unfinished_bound"
down_revision: str | None = "0018_event_outbox"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.add_column(
            sa.Column(
                "unfinished_bound",
                sa.Integer(),
                nullable=True,
                comment="at least the team's unfinished jobs (PostgreSQL; NULL: unknown), so a submission checks the "
                "cap without counting them: core.repositories.submissions.insert_submitted",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("unfinished_bound")
