"""Each kiln database names itself (migration 0009), and `kiln up` will not start it on another's storage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cli.errors import CliError, ExitCode
from cli.server.up import _claim_storage
from core.deployment import deployment_uid
from core.models import Deployment
from core.settings import Settings
from harness.workers_cluster import admit, submit, tiny_spec
from tests.support.api import migrated_sqlite
from workers.attempt_env import local_tier_dir
from workers.claim import claim
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration


def test_every_database_gets_one_uid_of_its_own(db: Session, tmp_path: Path) -> None:
    assert db.scalar(select(func.count()).select_from(Deployment)) == 1
    uid = deployment_uid(db)
    assert re.fullmatch(r"[0-9a-f]{32}", uid)
    with migrated_sqlite(tmp_path) as engine, Session(engine) as other:
        assert deployment_uid(other) != uid


def test_kiln_up_refuses_a_storage_directory_another_database_claimed(tmp_path: Path) -> None:
    """A database recreated beside the old one's files: before, its job 1 took the old job 1's checkpoints, logs
    and compile cache for its own."""
    storage = tmp_path / "storage"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    with migrated_sqlite(tmp_path / "old") as old, migrated_sqlite(tmp_path / "new") as new:
        _claim_storage(str(old.url), storage)
        _claim_storage(str(old.url), storage)
        with pytest.raises(CliError) as refused:
            _claim_storage(str(new.url), storage)
    assert refused.value.code == ExitCode.CONFLICT
    assert "belongs to another kiln database" in str(refused.value)


def test_a_claimed_attempt_keeps_its_local_tier_under_the_databases_uid(db: Session, tmp_path: Path) -> None:
    settings = Settings(lease_s=10.0, local_tier_dir=tmp_path / "shm")
    host = HostAgent(name="dep-a", inventory=NoGpus(), cpu_slots=1, address="127.0.0.1", settings=settings).register(db)
    db.flush()
    spec = tiny_spec("tiered", steps=10)
    spec["checkpointing"] = {**spec.get("checkpointing", {}), "local_tier": True}
    job = submit(db, spec)
    attempt = admit(db, job, host)
    claimed = claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=settings,
    )
    assert claimed.deployment == deployment_uid(db)
    assert local_tier_dir(settings, claimed) == (tmp_path / "shm").resolve() / claimed.deployment / "jobs" / str(job.id)


def test_the_scheduler_will_not_lead_on_another_databases_storage(tmp_path: Path) -> None:
    import threading

    from core.deployment import StorageOfAnotherDeployment, claim_storage
    from scheduler.live.loop import run_forever

    claim_storage(tmp_path / "storage", "f" * 32)
    with migrated_sqlite(tmp_path) as engine:
        settings = Settings(home=tmp_path, database_url=str(engine.url), storage_dir=tmp_path / "storage")
        with pytest.raises(StorageOfAnotherDeployment):
            run_forever(settings, dispatch=lambda *a, **k: None, stop=threading.Event())


def test_the_api_will_not_serve_another_databases_storage(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from core.deployment import StorageOfAnotherDeployment, claim_storage

    claim_storage(tmp_path / "storage", "f" * 32)
    with migrated_sqlite(tmp_path) as engine:
        app = create_app(Settings(home=tmp_path, storage_dir=tmp_path / "storage"), engine=engine)
        with pytest.raises(StorageOfAnotherDeployment), TestClient(app):
            pass


def test_an_api_started_while_the_database_was_down_checks_the_storage_before_it_serves_it(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from core.db import make_engine
    from core.deployment import MARKER, claim_storage
    from core.migrate import upgrade
    from core.services.bootstrap import bootstrap_admin
    from tests.support.api import auth

    later = tmp_path / "later"  # the database's directory is not there yet: it cannot be opened
    url = f"sqlite:///{later / 'kiln.db'}"
    engine = make_engine(url)
    storage = tmp_path / "storage"
    claim_storage(storage, "f" * 32)
    app = create_app(Settings(home=tmp_path, storage_dir=storage), engine=engine)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/readyz").status_code == 503
        later.mkdir()
        upgrade(url)  # the database is back
        with Session(engine) as db:
            _admin, secret = bootstrap_admin(db=db, name="root")
            db.commit()
            uid = deployment_uid(db)
        r = client.get("/v1/jobs/1/logs", headers=auth(secret))
        assert r.status_code == 503 and r.headers["content-type"].startswith("application/problem+json")
        assert "belongs to another kiln database" in r.json()["detail"] and "f" * 32 not in r.json()["detail"]

        (storage / MARKER).unlink()  # the operator: that database is gone, its files may be reused
        r = client.get("/v1/jobs/1/logs", headers=auth(secret))
        assert r.status_code == 404  # no such job: the storage is checked (and now claimed) first
        assert (storage / MARKER).read_text().strip() == uid
    engine.dispose()
