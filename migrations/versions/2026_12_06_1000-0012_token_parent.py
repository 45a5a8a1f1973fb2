"""api_tokens.parent_id: the token that minted a token, so that revoking a token revokes every token minted from it

A token minted before this revision has no parent on record (NULL): it is revoked on its own, as before.

Revision ID: 0012_token_parent
Revises: 0011_sweep_search
Create Date: 2026-12-06 10:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_token_parent"
down_revision: str | None = "0011_sweep_search"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(
            sa.Column(
                "parent_id",
                sa.Integer(),
                nullable=True,
                comment="the token that minted this one: revoking it revokes this one",
            )
        )
        batch.create_index(batch.f("ix_api_tokens_parent_id"), ["parent_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_api_tokens_parent_id_api_tokens"), "api_tokens", ["parent_id"], ["id"], ondelete="SET NULL"
        )


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_constraint(batch.f("fk_api_tokens_parent_id_api_tokens"), type_="foreignkey")
        batch.drop_index(batch.f("ix_api_tokens_parent_id"))
        batch.drop_column("parent_id")
