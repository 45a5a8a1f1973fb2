"""The dashboard's queue page API on PostgreSQL: the submission-time filter over every view, with positions that
stay the whole queue's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import Job
from core.states import JobState
from core.transitions import transition
from tests.support.api import World, spec

pytestmark = pytest.mark.integration


def test_the_queue_filters_by_submission_time_and_keeps_the_queues_positions(
    client: TestClient, world: World, db: Session
) -> None:
    h = world.h("member")
    now = datetime.now(UTC)
    ids = [client.post("/v1/jobs", json=spec(name=f"when-{i}"), headers=h).json()["id"] for i in range(3)]
    for job_id, days in zip(ids, (10, 2, 0), strict=True):
        row = db.get(Job, job_id)
        assert row is not None
        row.submitted_at = now - timedelta(days=days, minutes=1)
    done = db.get(Job, ids[1])
    assert done is not None
    transition(db, done, JobState.CANCELLED)
    db.flush()

    def page(view: str, **params: str) -> list[tuple[int, int | None]]:
        query = {"view": view, "team": "alpha", **params}
        r = client.get("/v1/dashboard/queue", params=query, headers=h)
        assert r.status_code == 200, r.text
        return [(row["id"], row["position"]) for row in r.json()["items"] if row["id"] in ids]

    everything = page("waiting")
    assert [i for i, _ in everything] == [ids[0], ids[2]]
    week = (now - timedelta(days=7)).isoformat()
    assert page("waiting", submitted_after=week) == [everything[1]]  # its position in the whole queue
    assert page("finished", submitted_after=week) == [(ids[1], None)]
    naive = (now - timedelta(hours=1)).replace(tzinfo=None).isoformat()  # no zone: UTC
    assert page("waiting", submitted_after=naive) == [everything[1]] and page("finished", submitted_after=naive) == []
    bad = client.get("/v1/dashboard/queue", params={"submitted_after": "yesterday"}, headers=h)
    assert (bad.status_code, bad.headers["content-type"]) == (422, "application/problem+json")
