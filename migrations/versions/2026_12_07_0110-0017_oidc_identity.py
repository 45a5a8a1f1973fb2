"""OpenID Connect sign-in: a user's identity at the provider (issuer, subject), and which memberships the provider's
groups granted (those, and only those, a later sign-in may take away)

Users and memberships made before this revision are local (NULL identity, ``from_sso`` false): sign-in never
touches them.

Revision ID: 0017_oidc_identity
Revises: 0016_forecasts
Create Date: 2026-12-07 01:10:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_oidc_identity"
down_revision: str | None = "0016_forecasts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("oidc_issuer", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("oidc_subject", sa.String(length=255), nullable=True))
        batch.create_unique_constraint(batch.f("uq_users_oidc_issuer_oidc_subject"), ["oidc_issuer", "oidc_subject"])
    with op.batch_alter_table("memberships") as batch:
        batch.add_column(sa.Column("from_sso", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("memberships") as batch:
        batch.drop_column("from_sso")
    with op.batch_alter_table("users") as batch:
        batch.drop_constraint(batch.f("uq_users_oidc_issuer_oidc_subject"), type_="unique")
        batch.drop_column("oidc_subject")
        batch.drop_column("oidc_issuer")
