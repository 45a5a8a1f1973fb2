"""Exactly one delivery wins a claim under real concurrency (PostgreSQL row locks), and the embedded default
(SQLite + kombu's SQLAlchemy transport, no server at all) runs the main job end to end with a real worker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from core.db import make_engine
from core.migrate import upgrade
from core.models import Attempt, Event, Job
from core.settings import Settings, get_settings
from harness.services import temporary_database
from harness.workers_cluster import SchedulerThread, admit, cluster, submit, wait_for
from workers.claim import Refused, claim
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_concurrent_deliveries_exactly_one_claims() -> None:
    from sqlalchemy.orm import sessionmaker

    settings = Settings(lease_s=10.0)
    with temporary_database("kiln_claim") as url:
        upgrade(url)
        engine = make_engine(url)
        maker = sessionmaker(bind=engine, expire_on_commit=False)
        with maker() as db:
            host = HostAgent(
                name="race",
                inventory=NoGpus(),
                cpu_slots=1,
                address=None,
                settings=get_settings().model_copy(update={"heartbeat_interval_s": 1}),
            )
            host_row = host.register(db)
            job = submit(db, yaml.safe_load((ROOT / "examples" / "gpt-tiny.yaml").read_text()))
            attempt = admit(db, job, host_row)
            db.commit()
            attempt_id, token, job_id = attempt.id, attempt.fencing_token, job.id
        barrier = threading.Barrier(8)
        results: list[str] = []

        def deliver(i: int) -> None:
            barrier.wait()
            with maker() as db:
                try:
                    claim(
                        db,
                        attempt_id=attempt_id,
                        token=token,
                        node_rank=0,
                        host="race",
                        delivery=f"d{i}",
                        settings=settings,
                    )
                    results.append("won")
                except Refused:
                    results.append("refused")
                db.commit()

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        with maker() as db:
            refusals = db.scalars(select(Event).where(Event.job_id == job_id, Event.type == "DELIVERY_REFUSED")).all()
            running = db.scalars(select(Event).where(Event.job_id == job_id, Event.type == "RUNNING")).all()
            att = db.get(Attempt, attempt_id)
            assert att is not None
            claimed_by = att.placement[0]["claimed_by"]
        engine.dispose()
    assert sorted(results) == ["refused"] * 7 + ["won"]
    assert len(refusals) == 7 and len(running) == 1
    assert claimed_by not in {e.data["delivery"] for e in refusals}


@pytest.mark.timeout(180)
def test_embedded_default_runs_the_main_job(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "gpt-tiny.yaml").read_text())
    with cluster(
        tmp_path, database_url=f"sqlite:///{tmp_path}/kiln.db", broker_url=f"sqla+sqlite:///{tmp_path}/broker.db"
    ) as c:
        c.start_worker("laptop", cpu_slots=1)
        maker = c.sessionmaker()
        with maker() as db:
            job_id = submit(db, spec).id
            db.commit()
        sched = SchedulerThread(maker, get_settings(), interval_s=0.5).start()
        try:

            def finished() -> str | None:
                with maker() as db:
                    job = db.get(Job, job_id)
                    assert job is not None
                    return job.state if job.state in ("SUCCEEDED", "FAILED") else None

            wait_for(finished, 150, "the main job finished")
        finally:
            sched.stop()
        with maker() as db:
            job = db.get(Job, job_id)
            assert job is not None
            assert job.state == "SUCCEEDED", job.exit_reason
            assert job.last_step == 60 and job.last_loss is not None and job.last_loss < 4.0
            types = [e.type for e in db.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id))]
            assert types.count("CHECKPOINT") == 3  # every 20 steps
            assert "MEMORY_PREDICTION" in types and types[-1] == "SUCCEEDED"
        log = (get_settings().resolved_storage_dir / "logs" / str(job_id) / "1.log").read_text()
        assert "launching:" in log and "trainer exited with 0: succeeded" in log


def test_broker_visibility_timeout_comes_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import celery_app

    def fresh() -> dict[str, object]:
        get_settings.cache_clear()
        celery_app.get_app.cache_clear()
        return dict(celery_app.get_app().conf.broker_transport_options)

    monkeypatch.setenv("KILN_BROKER_URL", "redis://127.0.0.1:6379/0")
    try:
        monkeypatch.delenv("KILN_BROKER_VISIBILITY_TIMEOUT_S", raising=False)
        assert fresh()["visibility_timeout"] == 12 * 3600.0  # long jobs: no redelivery of every running attempt
        monkeypatch.setenv("KILN_BROKER_VISIBILITY_TIMEOUT_S", "2.5")
        assert get_settings.__wrapped__().broker_visibility_timeout_s == 2.5
        options = fresh()
        assert options["visibility_timeout"] == 2.5 and options["unacked_restore_interval"] == 1
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        celery_app.get_app.cache_clear()


def test_a_registered_hosts_queue_already_exists_on_the_embedded_broker(tmp_path: Path) -> None:
    """kombu's SQLAlchemy transport declares a queue by SELECT then INSERT: the worker's consumer and the
    scheduler's first dispatch racing to create it once killed the worker (UNIQUE constraint). The worker now
    declares its queue before it registers, so a host the scheduler can see always has its queue."""
    import sqlite3

    with cluster(
        tmp_path, database_url=f"sqlite:///{tmp_path}/kiln.db", broker_url=f"sqla+sqlite:///{tmp_path}/broker.db"
    ) as c:
        name = c.start_worker("fresh", cpu_slots=1)
        maker = c.sessionmaker()

        def registered() -> bool:
            with maker() as db:
                return db.scalars(select(Event).where(Event.type == "HOST_REGISTERED")).first() is not None

        wait_for(registered, 60, "the host registered")
        with sqlite3.connect(tmp_path / "broker.db") as broker:
            queues = {row[0] for row in broker.execute("SELECT name FROM kombu_queue")}
        assert f"host.{name}" in queues, queues
