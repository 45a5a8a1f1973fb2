"""Issue 12, fault 2: Redis SIGKILLed while a worker holds an unacknowledged message (a running attempt: late
acks) must not leave the worker heartbeating with a dead consumer. Its running attempt trains on, untouched,
and the next job placed on the same host is picked up and runs.

A private Redis (its own port): the shared one serves every other test on the machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from core.db import utcnow
from core.models import Attempt, Event, Host
from harness.redis_server import RedisServer, private_redis
from harness.workers_cluster import Cluster, cluster_on_new_database, slow_steps, tiny_spec, wait_for
from tests.support.cluster_rows import finished_state, job_events, job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def broker_and_cluster(tmp_path: Path) -> Iterator[tuple[RedisServer, Cluster]]:
    with (
        private_redis(tmp_path / "redis") as broker,
        cluster_on_new_database(tmp_path, "kiln_broker_crash", broker_url=broker.url(), lease_s=10.0) as c,
    ):
        yield broker, c


def test_redis_sigkill_leaves_no_worker_that_heartbeats_without_consuming(
    broker_and_cluster: tuple[RedisServer, Cluster],
) -> None:
    broker, c = broker_and_cluster
    host = c.start_worker("a", cpu_slots=2, hooks=slow_steps(0.2))
    maker = c.sessionmaker()
    running = c.submit_job(tiny_spec("holds-a-message", steps=100, every_steps=20))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, running).last_step >= 5, 120, "training under way (its message unacknowledged)")
        broker.kill()
        broker.start()  # on the same port, empty: the unacknowledged message is gone with the old server
        step_at_restart = job_row(c, running).last_step
        after = c.submit_job(tiny_spec("placed-after-the-crash", steps=20, every_steps=10))
        wait_for(lambda: finished_state(c, after), 150, "the job placed on the host after the crash finished")
        wait_for(lambda: finished_state(c, running), 150, "the running job finished")
    finally:
        sched.stop()

    second, first = job_row(c, after), job_row(c, running)
    assert second.state == "SUCCEEDED", (second.exit_reason, c.log_text(host)[-3000:])
    assert first.state == "SUCCEEDED", first.exit_reason
    with maker() as db:
        attempts = db.scalars(select(Attempt).where(Attempt.job_id == running)).all()
    # The running attempt was not killed by the consumer's recovery: one attempt, no restart, all its steps.
    assert [a.state for a in attempts] == ["SUCCEEDED"] and first.restart_count == 0
    assert first.last_step == 100 and step_at_restart < 100
    assert not job_events(c, running, "LOST")


def _host_state(c: Cluster, name: str) -> tuple[str, float]:
    """The host's state and the age of its last heartbeat, in seconds."""
    with c.sessionmaker()() as db:
        host = db.scalars(select(Host).where(Host.name == name)).one()
        return host.state, (utcnow() - host.last_heartbeat_at).total_seconds()


def test_a_consumer_killed_by_the_broker_crash_is_restarted_in_place_and_the_host_is_unreachable_meanwhile(
    broker_and_cluster: tuple[RedisServer, Cluster],
) -> None:
    """The consumer holds an unacknowledged message (a delivery held before its claim, the test hook) when Redis is
    SIGKILLed: kombu's consumer dies of it. While nothing is consumed the host heartbeats but is UNREACHABLE (not
    placed on); the consumer is started again inside the same worker process, the attempt already running trains
    on untouched, and the host takes work again."""
    broker, c = broker_and_cluster
    host = c.start_worker("a", cpu_slots=2, hooks={**slow_steps(0.2), "hold_delivery_s": 4.0})
    maker = c.sessionmaker()
    running = c.submit_job(tiny_spec("trains-through-it", steps=100, every_steps=20))
    sched = c.scheduler_thread()
    try:
        wait_for(lambda: job_row(c, running).last_step >= 3, 120, "the first job training")
        pid = c.workers[host].pid
        held = c.submit_job(tiny_spec("held-when-redis-dies", steps=20, every_steps=10))
        wait_for(lambda: c.log_text(host).count("holding the delivery") >= 2, 60, "the second delivery held")
        broker.kill()
        # Nothing consumes while Redis is away: the host is UNREACHABLE, its heartbeat fresh.
        state = wait_for(
            lambda: _host_state(c, host)[0] == "UNREACHABLE" and _host_state(c, host), 60, "the host UNREACHABLE"
        )
        assert state[1] < 5.0, "the worker still heartbeats"
        broker.start()
        wait_for(lambda: _host_state(c, host)[0] == "UP", 60, "the host UP again once its consumer consumes")
        after = c.submit_job(tiny_spec("placed-after-the-restart", steps=20, every_steps=10))
        for job_id in (held, after, running):
            wait_for(lambda j=job_id: finished_state(c, j), 180, f"job {job_id} finished")  # type: ignore[misc]
    finally:
        sched.stop()

    log = c.log_text(host)
    assert "Unrecoverable error" in log, "the broker crash should have killed kombu's consumer (a message was held)"
    assert "stopped on its own; starting it again" in log
    assert c.workers[host].pid == pid and c.workers[host].poll() is None, "the same worker process throughout"
    for job_id in (running, held, after):
        job = job_row(c, job_id)
        assert job.state == "SUCCEEDED" and job.restart_count == 0, (job_id, job.state, job.exit_reason)
    assert job_row(c, running).last_step == 100 and not job_events(c, running, "LOST")
    with maker() as db:
        events = [
            e.type
            for e in db.scalars(
                select(Event).where(Event.type.in_(["HOST_UNREACHABLE", "HOST_REACHABLE"])).order_by(Event.id)
            )
        ]
    assert events[:2] == ["HOST_UNREACHABLE", "HOST_REACHABLE"], events
