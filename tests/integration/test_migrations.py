"""Alembic upgrade -> downgrade -> upgrade on PostgreSQL, and the models match the migrations."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text

import core.models  # noqa: F401
from core.db import Base, make_engine
from core.migrate import downgrade, upgrade
from harness.services import temporary_database

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


def test_the_queue_wait_columns_are_rebuilt_from_each_jobs_timeline(tmp_path: pytest.TempPathFactory) -> None:
    """0008 counts every wait a job had before the upgrade, from its events: a job admitted after 100 s, preempted,
    and admitted again 50 s after its requeue waited 150 s (not the hour it ran); a job back in the queue after a
    lost host waits from the end of its backoff; a job never admitted keeps waiting from its submission."""
    url = f"sqlite:///{tmp_path}/kiln.db"
    upgrade(url, "0007_datasets")
    engine = make_engine(url)
    t0 = "2026-03-02 09:00:00"

    def at(seconds: int) -> str:
        return f"2026-03-02 {9 + seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO teams (id, name, fair_share_weight, budget_period_s, created_at) "
                    "VALUES (1, 't', 1, 2592000, :t0)"
                ),
                {"t0": t0},
            )
            for jid, state in ((1, "RUNNING"), (2, "QUEUED"), (3, "QUEUED")):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, name, team_id, spec, state, qos_class_id, priority, gpus, "
                        "restart_count, fencing_token, cancel_requested, preempt_requested, last_step, submitted_at, "
                        "updated_at) "
                        "VALUES (:id, 'j', 1, '{}', :state, (SELECT min(id) FROM qos_classes), 0, 1, 0, 0, 0, 0, 0, "
                        ":t0, :t0)"
                    ),
                    {"id": jid, "state": state, "t0": t0},
                )
            timeline = [
                (1, "ADMITTED", "{}", 100),
                (1, "QUEUED", "{}", 3700),
                (1, "ADMITTED", "{}", 3750),
                (2, "ADMITTED", "{}", 10),
                (2, "QUEUED", '{"not_before": "2026-03-02T10:00:30+00:00"}', 3600),
            ]
            for jid, type_, data, seconds in timeline:
                conn.execute(
                    text(
                        "INSERT INTO events (job_id, team_id, type, message, data, created_at) "
                        "VALUES (:j, 1, :ty, '', :d, :at)"
                    ),
                    {"j": jid, "ty": type_, "d": data, "at": at(seconds)},
                )
        upgrade(url)
        with engine.connect() as conn:
            rows = {r[0]: (r[1], r[2]) for r in conn.execute(text("SELECT id, queued_s, wait_started_at FROM jobs"))}
            assert conn.scalar(text("SELECT count(*) FROM events")) == len(timeline)  # nothing cascaded away
        assert rows[1] == (150.0, None)
        assert rows[2][0] == 10.0 and str(rows[2][1]).startswith("2026-03-02 10:00:30")
        assert rows[3] == (0.0, None)
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
            conn.execute(
                text(
                    "INSERT INTO hosts (id, name, queue, state, cpu_slots, links, registered_at) "
                    "VALUES (1, 'h1', 'host.h1', 'UP', 8, '{}', '2026-03-02 09:00:00')"
                )
            )
            conn.execute(
                text(
                    'INSERT INTO gpus (host_id, uuid, "index", model, memory_bytes, mig_mode, nvlink_peers, '
                    "last_sample, healthy) VALUES (1, 'GPU-0', 0, 'H200', 1, 0, '[]', '{}', 1)"
                )
            )
        upgrade(url)
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM gpus")) == 1
            assert conn.scalar(text("PRAGMA foreign_keys")) == 1  # kiln's own connections keep them on
    finally:
        engine.dispose()
