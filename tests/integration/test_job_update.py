"""Changing a queued job (PATCH /v1/jobs/{id}, kiln update; Slurm's scontrol update) on PostgreSQL: checked as a
submission is, the priority and the contract following the class, a timeline event; a running job is refused."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.models import Job
from core.states import JobState
from core.transitions import transition
from tests.support.api import World

pytestmark = pytest.mark.integration


def test_a_queued_jobs_class_and_time_limit_change(client: TestClient, world: World) -> None:
    h = world.h("member")
    job = world.jobs["alpha"]
    before = client.get(f"/v1/jobs/{job}", headers=h).json()
    r = client.patch(f"/v1/jobs/{job}", json={"qos": "bronze", "time_limit_s": 7200}, headers=h)
    assert r.status_code == 200, r.text
    after = r.json()
    bronze = client.get("/v1/qos/bronze", headers=h).json()
    assert (before["qos"], after["qos"], after["priority"]) == ("silver", "bronze", bronze["priority"])
    assert after["spec"]["sla"]["qos"] == "bronze" and after["spec"]["time_limit_s"] == 7200
    assert client.get(f"/v1/jobs/{job}/sla", headers=h).json()["qos"] == "bronze"  # the contract follows
    (event,) = [e for e in client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"] if e["type"] == "UPDATED"]
    assert event["actor"] == "mark" and event["message"] == "qos silver -> bronze; time_limit none -> 7200 s (by mark)"
    assert event["data"] == {"qos": ["silver", "bronze"], "time_limit_s": [None, 7200.0]}

    removed = client.patch(f"/v1/jobs/{job}", json={"time_limit_s": None}, headers=h).json()
    assert "time_limit_s" not in removed["spec"] or removed["spec"]["time_limit_s"] is None
    assert removed["qos"] == "bronze"  # left out: unchanged
    same = client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=h)
    assert same.status_code == 200  # nothing changed: no event
    types = [e["type"] for e in client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"]]
    assert types.count("UPDATED") == 2


def test_a_change_is_checked_as_a_submission_is(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    job = world.jobs["alpha"]
    cases = [
        ({"qos": "gold"}, 403, None),  # not one of the team's classes
        ({"qos": "platinum"}, 422, "sla.qos"),
        ({"time_limit_s": 0}, 422, "time_limit_s"),
        ({"gpus": 8}, 422, "gpus"),  # not a field that can change
    ]
    for body, status, loc in cases:
        r = client.patch(f"/v1/jobs/{job}", json=body, headers=h)
        assert (r.status_code, r.headers["content-type"]) == (status, "application/problem+json"), (body, r.text)
        if loc is not None:
            assert loc in [e["loc"] if isinstance(e["loc"], str) else ".".join(map(str, e["loc"]))
                           for e in r.json()["errors"]], r.json()  # fmt: skip
    assert client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=world.h("viewer")).status_code == 403
    assert client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=world.h("beta-member")).status_code == 404
    row = db.get(Job, job)
    assert row is not None
    transition(db, row, JobState.ADMITTED)
    db.flush()
    r = client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=h)
    assert r.status_code == 409 and f"kiln hold {job}" in r.json()["detail"]
