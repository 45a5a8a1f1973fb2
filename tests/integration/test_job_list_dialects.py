"""The job list is one query and a job one shape: PostgreSQL (driver SQL, its fast path) and SQLite (the embedded
default, through SQLAlchemy) answer the same JSON for the same jobs and filters, and a submission answers what a
later read shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from api.schemas.jobs import JobOut, job_json, page_json
from core.db import make_engine
from core.migrate import upgrade
from core.services import jobs as jobs_svc
from core.services.bootstrap import bootstrap_admin
from core.services.principal import Principal
from core.spec import parse_spec_data
from tests.support.api import spec

pytestmark = pytest.mark.integration

JOBS = (
    spec(name="first", team="default", steps=10),
    spec(name="second", team="default", steps=20, sla={"qos": "gold"}),
    spec(name="third", team="default", steps=30, recipe={"name": "mlp", "hyperparameters": {}}),
)


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Session]:
    url = f"sqlite:///{tmp_path / 'kiln.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine, expire_on_commit=False) as session:
        yield session
    engine.dispose()


def _submit_all(db: Session) -> tuple[Principal, list[int]]:
    user, _ = bootstrap_admin(db=db, name="list-admin", force=True)
    admin = Principal(user_id=user.id, name=user.name, user_is_admin=True, scopes=frozenset({"read", "write", "admin"}))
    submitted = [jobs_svc.submit(db=db, principal=admin, spec=parse_spec_data(s)) for s in JOBS]
    for view in submitted:  # the submission's answer is the job as any later read shows it
        assert json.loads(job_json(view)) == json.loads(job_json(jobs_svc.get(db=db, principal=admin, job_id=view.id)))
    ids = [view.id for view in submitted]
    jobs_svc.cancel(db=db, principal=admin, job_id=ids[0], reason="not needed")
    db.flush()
    return admin, ids


def _pages(db: Session) -> dict[str, Any]:
    """Each filter's answer, as the API would send it, with what differs between two databases by nature (ids
    from sequences other tests also advanced, the times of submission and cancellation) taken out and checked for
    form."""
    admin, ids = _submit_all(db)
    filters: dict[str, dict[str, Any]] = {
        "all": {"team": "default"},
        "page": {"team": "default", "limit": 2},
        "older": {"team": "default", "before_id": ids[2]},
        "states": {"team": "default", "states": ["QUEUED"]},
        "qos": {"team": "default", "qos": "gold"},
        "name": {"team": "default", "name": "third"},
        "none": {"team": "default", "states": ["RUNNING"]},
    }
    answers: dict[str, Any] = {}
    for key, kw in filters.items():
        page = jobs_svc.list_jobs(db=db, principal=admin, **kw)
        document = json.loads(page_json(page.items, None, utc=page.utc))
        for item in document["items"]:
            assert list(item) == list(JobOut.model_fields)  # JobOut's fields, in its order
            assert item.pop("id") in ids
            assert item.pop("submitted_at").endswith("Z")
            finished = item.pop("finished_at")
            assert (finished is None) == (item["state"] != "CANCELLED") and (finished is None or finished.endswith("Z"))
            since, queued = item.pop("waiting_since"), item.pop("queued_s")  # when each waited: not the same twice
            assert (since is None) == (item["state"] != "QUEUED") and (since is None or since.endswith("Z"))
            assert queued >= 0 and (queued == 0) == (item["state"] == "QUEUED")  # a cancelled job's wait ended
        document["has_next"] = page.next_before_id is not None
        answers[key] = document
    return answers


def test_sqlite_and_postgresql_answer_the_same_job_list(db: Session, sqlite_db: Session) -> None:
    on_postgresql, on_sqlite = _pages(db), _pages(sqlite_db)
    assert on_postgresql == on_sqlite
    assert [j["name"] for j in on_sqlite["all"]["items"]] == ["third", "second", "first"]
    assert [j["name"] for j in on_sqlite["older"]["items"]] == ["second", "first"]
    assert on_sqlite["page"]["has_next"] and not on_sqlite["all"]["has_next"]
    assert [j["steps"] for j in on_sqlite["all"]["items"]] == [30, 20, 10]
    assert on_sqlite["all"]["items"][2]["state"] == "CANCELLED"
    assert on_sqlite["none"]["items"] == []
