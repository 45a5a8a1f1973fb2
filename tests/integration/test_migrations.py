"""Alembic upgrade -> downgrade -> upgrade on PostgreSQL, and the models match the migrations."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text

import core.models  # noqa: F401
from core.db import Base, make_engine
from core.migrate import downgrade, upgrade
from tests.support.services import temporary_database

pytestmark = pytest.mark.integration


def test_upgrade_downgrade_upgrade_and_models_match() -> None:
    with temporary_database("kiln_migr") as url:
        engine = make_engine(url)
        try:
            upgrade(url)
            downgrade(url, "base")
            with engine.connect() as conn:
                assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
            upgrade(url)
            with engine.connect() as conn:
                diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
                assert diff == [], f"models and migrations differ: {diff}"
                names = set(conn.scalars(select(text("name")).select_from(text("qos_classes"))))
                assert names == {"gold", "silver", "bronze", "best-effort"}
        finally:
            engine.dispose()


def test_sqlite_upgrade_runs(tmp_path: pytest.TempPathFactory) -> None:
    url = f"sqlite:///{tmp_path}/kiln.db"  # the embedded default runs the same migrations
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        assert "jobs" in inspect(conn).get_table_names()
    engine.dispose()
