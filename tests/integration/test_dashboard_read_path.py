"""The dashboard reads a job list, a job's timeline and its metrics as ``/v1/jobs`` does, on PostgreSQL: the queue
page's finished view walks the same rows as the job list, and the job page holds the whole timeline."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import Event, Job, JobMetric
from core.services import dashboard
from core.states import JobState
from core.transitions import transition
from tests.support.api import World, spec

pytestmark = pytest.mark.integration


def test_the_finished_view_pages_through_the_job_list_with_its_total(
    client: TestClient, world: World, db: Session
) -> None:
    h = world.h("member")
    ids = [client.post("/v1/jobs", json=spec(name=f"done-{i}"), headers=h).json()["id"] for i in range(3)]
    for job_id in ids:
        client.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "enough"}, headers=h)
    listed = client.get("/v1/jobs", params={"team": "alpha", "state": "CANCELLED", "limit": 500}, headers=h).json()
    expected = [row["id"] for row in listed["items"]]

    seen: list[dict[str, object]] = []
    cursor = None
    while True:
        params = {"view": "finished", "team": "alpha", "limit": 2, **({"cursor": cursor} if cursor else {})}
        r = client.get("/v1/dashboard/queue", params=params, headers=h)
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["total"] == len(expected)
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [row["id"] for row in seen] == expected
    mine = [row for row in seen if row["id"] in ids]
    assert {row["team"] for row in mine} == {"alpha"} and all(row["position"] is None for row in mine)
    assert all(
        str(row["exit_reason"]).startswith("cancelled by ") and str(row["exit_reason"]).endswith(": enough")
        for row in mine
    )
    finished_at = datetime.fromisoformat(str(mine[0]["finished_at"]))
    assert finished_at.utcoffset() == UTC.utcoffset(None)  # answered in UTC, whatever the session's zone
    row = next(row for row in mine if row["id"] == ids[0])
    overview = client.get(f"/v1/dashboard/jobs/{ids[0]}", headers=h).json()
    assert row["max_wait_s"] == overview["job"]["max_wait_s"] is not None  # the QoS class's default, by its name


def test_the_active_view_shows_running_jobs_only(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    queued, running = (client.post("/v1/jobs", json=spec(name=n), headers=h).json()["id"] for n in ("q", "r"))
    job = db.get(Job, running)
    assert job is not None
    transition(db, job, JobState.ADMITTED)
    db.flush()
    rows = client.get("/v1/dashboard/queue", params={"view": "active", "team": "alpha"}, headers=h).json()["items"]
    assert [r["id"] for r in rows] == [running] and rows[0]["state"] == "ADMITTED"
    assert rows[0]["wait_s"] >= 0 and rows[0]["qos"] == client.get(f"/v1/jobs/{running}", headers=h).json()["qos"]
    assert queued not in {r["id"] for r in rows}


def test_the_job_page_holds_every_event_and_tails_metrics_by_id(
    client: TestClient, world: World, db: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = world.h("member")
    job_id = client.post("/v1/jobs", json=spec(name="timeline"), headers=h).json()["id"]
    job = db.get(Job, job_id)
    assert job is not None
    now = datetime.now(UTC)
    db.add_all(Event(job_id=job_id, team_id=job.team_id, type="NOTE", message=f"{i}", created_at=now) for i in range(5))
    # a restart repeats steps: the tail follows ids, not steps
    db.add_all(JobMetric(job_id=job_id, step=step, ts=now, loss=1.0) for step in (1, 2, 1, 2))
    db.flush()
    monkeypatch.setattr(dashboard, "EVENTS_PER_READ", 2)  # the timeline read a page at a time, every page kept

    overview = client.get(f"/v1/dashboard/jobs/{job_id}", headers=h).json()
    timeline = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}, headers=h).json()["items"]
    assert [e["id"] for e in overview["events"]] == [e["id"] for e in timeline] and len(timeline) == 6

    first = client.get(f"/v1/dashboard/jobs/{job_id}/metrics", params={"limit": 3}, headers=h).json()
    assert [m["step"] for m in first["items"]] == [1, 2, 1]
    rest = client.get(f"/v1/dashboard/jobs/{job_id}/metrics", params={"after_id": first["last_id"]}, headers=h).json()
    assert [m["step"] for m in rest["items"]] == [2] and rest["last_id"] > first["last_id"]
