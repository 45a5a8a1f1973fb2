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


def test_no_qos_description_cites_the_seed_after_upgrade(tmp_path: pytest.TempPathFactory) -> None:
    """0003 rewrote the seeded descriptions only where the GPU caps were untouched; 0005_surface catches the rest
    and leaves a description an admin wrote as it is."""
    url = f"sqlite:///{tmp_path}/kiln.db"
    upgrade(url, "0002")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:  # an admin changed gold's cap, so 0003 passed it over
            conn.execute(text("UPDATE qos_classes SET gpu_memory_cap_bytes = 1 WHERE name = 'gold'"))
        upgrade(url, "0005_mps")
        with engine.begin() as conn:  # and wrote silver's text
            conn.execute(text("UPDATE qos_classes SET description = 'Ours: ask #gpu-ops' WHERE name = 'silver'"))
            before = dict(conn.execute(text("SELECT name, description FROM qos_classes")).tuples().all())
        assert "seed 004" in before["gold"]
        upgrade(url)
        with engine.connect() as conn:
            after = dict(conn.execute(text("SELECT name, description FROM qos_classes")).tuples().all())
        assert after["gold"] == "Never preempted by a lower class; the shortest queue-wait objective"
        assert after["silver"] == "Ours: ask #gpu-ops"
        assert not [d for d in after.values() if "seed" in d.lower()], after
    finally:
        engine.dispose()


def test_an_upgrade_on_sqlite_deletes_no_row_that_references_a_copied_table(tmp_path: pytest.TempPathFactory) -> None:
    """Batch mode copies a table and drops the old one: with foreign keys on, the drop cascaded, and 0006 (which
    copies ``hosts``) deleted every host's GPUs on the embedded default."""
    url = f"sqlite:///{tmp_path}/kiln.db"
    upgrade(url, "0005_notify")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO hosts (id, name, queue, state, cpu_slots, links, registered_at) "
                              "VALUES (1, 'h1', 'host.h1', 'UP', 8, '{}', '2026-03-02 09:00:00')"))  # fmt: skip
            conn.execute(text('INSERT INTO gpus (host_id, uuid, "index", model, memory_bytes, mig_mode, nvlink_peers, '
                              "last_sample, healthy) VALUES (1, 'GPU-0', 0, 'H200', 1, 0, '[]', '{}', 1)"))  # fmt: skip
        upgrade(url)
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM gpus")) == 1
            assert conn.scalar(text("PRAGMA foreign_keys")) == 1  # kiln's own connections keep them on
    finally:
        engine.dispose()
