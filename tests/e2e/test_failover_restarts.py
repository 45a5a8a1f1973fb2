"""Acceptance 2: restart Redis mid-run (a clean shutdown, then a SIGKILL), then PostgreSQL mid-run (down for a
lease): no job lost, none duplicated, none restarted; the API answers 503 while the database is away and recovers
by itself.

Redis and PostgreSQL are servers of the test's own, on free ports (``harness.redis_server``,
``harness.private_servers``): the shared ones never see these outages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from core.models import Attempt, Event, Job
from core.settings import get_settings
from harness.deps import missing
from harness.private_servers import PrivatePostgres, private_servers_available
from harness.redis_server import RedisServer, private_redis
from harness.workers_cluster import Cluster, cluster, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[tuple[RedisServer, PrivatePostgres, Cluster]]:
    unavailable = private_servers_available()
    if unavailable is not None:
        missing(f"a private PostgreSQL: {unavailable}")
    pg = PrivatePostgres().init()
    try:
        pg.start()
        url = pg.create_database("kiln_restarts")
        with (
            private_redis(tmp_path / "redis") as broker,
            cluster(tmp_path, database_url=url, broker_url=broker.url(), lease_s=10.0, heartbeat_s=1.0) as c,
        ):
            yield broker, pg, c
    finally:
        pg.remove()


def test_redis_then_postgres_restart_loses_and_duplicates_nothing(
    two_hosts: tuple[RedisServer, PrivatePostgres, Cluster],
) -> None:
    from api.app import create_app

    broker, pg, c = two_hosts
    # Slow steps on both hosts: the long job must still be training when each server goes away.
    hosts = [c.start_worker(label, cpu_slots=1, hooks=slow_steps(0.2)) for label in ("a", "b")]
    maker = c.sessionmaker()
    api = TestClient(create_app(get_settings()), raise_server_exceptions=False)
    assert api.get("/readyz").status_code == 200
    long_job = c.submit_job(tiny_spec("through-restarts", steps=120, every_steps=20))
    sched = c.scheduler_thread()  # the real scheduler
    try:
        wait_for(lambda: job_row(c, long_job).last_step >= 5, 90, "training under way")

        # 1. Redis goes away with everything in it (nosave). A job admitted meanwhile cannot be sent.
        broker.shutdown()
        orphan = c.submit_job(tiny_spec("admitted-while-redis-down", steps=30))
        wait_for(lambda: job_row(c, orphan).state == "ADMITTED", 30, "admitted while the broker is down")
        time.sleep(1.0)
        broker.start()
        step_after_clean = job_row(c, long_job).last_step

        # 1b. Redis killed (SIGKILL: no shutdown, the connections reset) while both workers run attempts.
        wait_for(lambda: job_row(c, long_job).last_step > step_after_clean, 30, "training after the clean restart")
        wait_for(lambda: job_row(c, orphan).state == "RUNNING", 60, "the orphan sent again and running")
        broker.kill()
        time.sleep(1.0)
        broker.start()
        step_after_redis = job_row(c, long_job).last_step

        # 2. PostgreSQL goes away for a lease: the API says 503 (problem+json), training goes on until the
        # trainer's lease (which no worker can renew meanwhile) runs out, waits, and all recovers.
        wait_for(lambda: job_row(c, long_job).last_step > step_after_redis, 30, "training after the Redis restart")
        pg.stop()
        try:
            away = api.get("/readyz")
            assert away.status_code == 503
            assert away.headers["content-type"].startswith("application/problem+json")
            time.sleep(get_settings().lease_s)
        finally:
            pg.start()
        wait_for(lambda: api.get("/readyz").status_code == 200, 30, "API ready again by itself")

        wait_for(lambda: job_row(c, long_job).state in ("SUCCEEDED", "FAILED"), 150, "long job finished")
        wait_for(lambda: job_row(c, orphan).state in ("SUCCEEDED", "FAILED"), 90, "orphaned job finished")
    finally:
        sched.stop()

    # Training holds no message (acknowledged at the claim), so the SIGKILL finds no attempt's message to restore.
    # A consumer probe in flight at that moment can still make kombu's consumer die (AttributeError in
    # restore_unacked_once); then the worker must have started its consumer again in place, trainers untouched
    # (the attempts below: none restarted).
    for host in hosts:
        log = c.log_text(host)
        if "Unrecoverable error" in log:
            assert "stopped on its own; starting it again" in log, log[-3000:]
    storage = get_settings().resolved_storage_dir
    with maker() as db:
        for job_id in (long_job, orphan):
            job = db.get(Job, job_id)
            assert job is not None and job.state == "SUCCEEDED", (job_id, job and job.exit_reason)
            attempts = db.scalars(select(Attempt).where(Attempt.job_id == job_id)).all()
            running = db.scalars(select(Event).where(Event.job_id == job_id, Event.type == "RUNNING")).all()
            assert len(attempts) == 1 and len(running) == 1, f"job {job_id} ran more than once"
            assert job.restart_count == 0
            log = (storage / "logs" / str(job_id) / "1.log").read_text()
            assert log.count("launching:") == 1
        # The message lost with Redis was sent again by the reconciler: the broker is not a database.
        resent = db.scalars(select(Event).where(Event.job_id == orphan, Event.type == "REDISPATCHED")).all()
        assert resent
        # The scheduler saw the database go away; once back, leases and hosts had one lease of grace.
        back = db.scalars(select(Event).where(Event.type == "DATABASE_BACK")).all()
        assert back and back[0].data["grace_s"] == get_settings().lease_s
        assert not db.scalars(select(Event).where(Event.type == "HOST_DOWN")).all(), "no host DOWN for the outage"
        assert db.get(Job, long_job).last_step == 120  # type: ignore[union-attr]
        # The trainer stopped (no step, no commit) when its lease ran out, and carried on once its worker renewed
        # the lease after the database came back: an outage longer than the lease restarts nothing.
        types = [e.type for e in db.scalars(select(Event).where(Event.job_id == long_job).order_by(Event.id))]
        assert types.index("LEASE_EXPIRED") < types.index("LEASE_RENEWED"), types
