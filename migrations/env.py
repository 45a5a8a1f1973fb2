"""Alembic environment: the URL comes from the caller (core.migrate) or KILN_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

import core.models  # noqa: F401  (registers the tables)
from core.db import Base, make_engine
from core.settings import get_settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # Batch mode copies a table and drops the old one; with foreign keys on (kiln's engines turn them on),
            # the drop would cascade and delete every row that references the table (a job's events, a host's
            # GPUs). The pragma only takes effect outside a transaction, so it goes first, and the keys are checked
            # before the migration commits.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()  # end SQLAlchemy's implicit transaction, so Alembic's own below commits the migration
        # render_as_batch: SQLite cannot ALTER constraints; batch mode copies the table instead.
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
            if sqlite:
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"the migration left rows whose foreign keys point nowhere: {broken[:5]}")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
