"""Changing a job (PATCH /v1/jobs/{id}, kiln update; Slurm's scontrol update) on PostgreSQL: checked as a
submission is, the priority and the contract following the class, a timeline event; a running job's time limit
only, as Slurm allows it (lowered by a member, raised or removed by a team admin or an admin)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Attempt, Job, JobDependency
from core.states import JobState
from core.transitions import transition
from tests.support.api import World, spec

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
        ({"steps": 8}, 422, "steps"),  # not a field that can change
        ({"gpus": -1}, 422, "gpus"),
    ]
    for body, status, loc in cases:
        r = client.patch(f"/v1/jobs/{job}", json=body, headers=h)
        assert (r.status_code, r.headers["content-type"]) == (status, "application/problem+json"), (body, r.text)
        if loc is not None:
            assert loc in [
                e["loc"] if isinstance(e["loc"], str) else ".".join(map(str, e["loc"])) for e in r.json()["errors"]
            ], r.json()
    assert client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=world.h("viewer")).status_code == 403
    assert client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=world.h("beta-member")).status_code == 404
    row = db.get(Job, job)
    assert row is not None
    transition(db, row, JobState.ADMITTED)
    db.flush()
    r = client.patch(f"/v1/jobs/{job}", json={"qos": "bronze"}, headers=h)
    assert r.status_code == 409 and f"kiln hold {job}" in r.json()["detail"]


def _running(db: Session, job_id: int, *, limit: float | None, ran_s: float) -> Job:
    """The job RUNNING for ``ran_s`` seconds under ``limit``."""
    row = db.get(Job, job_id)
    assert row is not None
    row.spec = {**row.spec, "time_limit_s": limit}
    transition(db, row, JobState.ADMITTED)
    transition(db, row, JobState.RUNNING)
    db.add(
        Attempt(
            job_id=row.id,
            number=1,
            fencing_token=1,
            state="RUNNING",
            placement=[],
            started_at=utcnow() - timedelta(seconds=ran_s),
        )
    )
    db.flush()
    db.expire(row, ["attempts"])
    return row


def test_a_running_jobs_time_limit_is_lowered_by_a_member_and_raised_by_an_admin(
    client: TestClient, world: World, db: Session
) -> None:
    job = world.jobs["alpha"]
    _running(db, job, limit=7200, ran_s=1800)
    member, team_admin = world.h("member"), world.h("team-admin")

    lowered = client.patch(f"/v1/jobs/{job}", json={"time_limit_s": 3600}, headers=member)
    assert lowered.status_code == 200, lowered.text
    assert lowered.json()["state"] == "RUNNING" and lowered.json()["spec"]["time_limit_s"] == 3600
    for body in ({"time_limit_s": 5400}, {"time_limit_s": None}):  # raised, removed: an admin's
        r = client.patch(f"/v1/jobs/{job}", json=body, headers=member)
        assert (r.status_code, r.headers["content-type"]) == (403, "application/problem+json"), r.text
        assert "you may lower it" in r.json()["detail"]
    too_low = client.patch(f"/v1/jobs/{job}", json={"time_limit_s": 1200}, headers=member)
    assert too_low.status_code == 422 and "has already run 1800 s" in too_low.json()["detail"], too_low.text
    class_change = client.patch(f"/v1/jobs/{job}", json={"qos": "bronze", "time_limit_s": 3000}, headers=member)
    assert class_change.status_code == 409 and "its time limit only" in class_change.json()["detail"]

    raised = client.patch(f"/v1/jobs/{job}", json={"time_limit_s": 14400}, headers=team_admin)
    assert raised.status_code == 200 and raised.json()["spec"]["time_limit_s"] == 14400
    assert client.patch(f"/v1/jobs/{job}", json={"time_limit_s": None}, headers=world.h("admin")).status_code == 200
    updates = [
        e["message"]
        for e in client.get(f"/v1/jobs/{job}/events", headers=member).json()["items"]
        if e["type"] == "UPDATED"
    ]
    assert updates == [
        "time_limit 7200 s -> 3600 s (by mark)",
        "time_limit 3600 s -> 14400 s (by alice)",
        "time_limit 14400 s -> none (by root)",
    ]


def test_a_running_job_without_a_limit_may_be_given_one_by_a_member(
    client: TestClient, world: World, db: Session
) -> None:
    job = world.jobs["alpha"]
    _running(db, job, limit=None, ran_s=60)
    r = client.patch(f"/v1/jobs/{job}", json={"time_limit_s": 3600}, headers=world.h("member"))
    assert r.status_code == 200 and r.json()["spec"]["time_limit_s"] == 3600, r.text


def test_a_queued_jobs_gpus_change_until_its_first_checkpoint(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    job = world.jobs["alpha"]
    before = client.get(f"/v1/jobs/{job}", headers=h).json()
    r = client.patch(f"/v1/jobs/{job}", json={"gpus": 2}, headers=h)
    assert r.status_code == 200, r.text
    assert (before["gpus"], r.json()["gpus"], r.json()["spec"]["resources"]["gpus"]) == (0, 2, 2)
    row = db.get(Job, job)
    assert row is not None and row.gpus == 2  # what the scheduler reads
    (event,) = [e for e in client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"] if e["type"] == "UPDATED"]
    assert event["message"] == "gpus 0 -> 2 (by mark)" and event["data"] == {"gpus": [0, 2]}

    row.spec = {**row.spec, "resources": {**row.spec["resources"], "gpus_per_node": 2}}
    db.flush()
    odd = client.patch(f"/v1/jobs/{job}", json={"gpus": 3}, headers=h)
    assert odd.status_code == 422 and "multiple of gpus_per_node" in odd.text, odd.text

    row.last_step = 40  # it ran, checkpointed, and was preempted: its checkpoint is of 2 GPUs' ranks
    db.flush()
    trained = client.patch(f"/v1/jobs/{job}", json={"gpus": 4}, headers=h)
    assert trained.status_code == 409 and f"kiln clone {job} --set resources.gpus=4" in trained.json()["detail"]
    assert client.patch(f"/v1/jobs/{job}", json={"time_limit_s": 600}, headers=h).status_code == 200  # not GPUs

    _running(db, world.jobs["alpha"], limit=None, ran_s=10)
    running = client.patch(f"/v1/jobs/{job}", json={"gpus": 2}, headers=h)
    assert running.status_code == 409 and "its time limit only" in running.json()["detail"]


def test_a_queued_jobs_dependencies_are_replaced_and_close_no_cycle(
    client: TestClient, world: World, db: Session
) -> None:
    h = world.h("member")
    first = world.jobs["alpha"]
    second = client.post("/v1/jobs", json=spec(team="alpha", name="second", depends_on=[str(first)]), headers=h)
    assert second.status_code == 201, second.text
    job = second.json()["id"]
    third = client.post("/v1/jobs", json=spec(team="alpha", name="third"), headers=h).json()["id"]

    r = client.patch(f"/v1/jobs/{job}", json={"depends_on": [f"afterany:{first}", str(third)]}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["depends_on"] == [f"afterany:{first}", str(third)]
    rows = db.scalars(select(JobDependency).where(JobDependency.job_id == job).order_by(JobDependency.depends_on_id))
    assert [(d.depends_on_id, d.condition) for d in rows] == [(first, "afterany"), (third, "afterok")]
    (event,) = [e for e in client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"] if e["type"] == "UPDATED"]
    assert event["message"] == f"depends_on afterok:{first} -> afterany:{first}, afterok:{third} (by mark)"

    # `first` waiting for `job`, which waits for `first`: neither would ever start.
    for target, deps in ((first, [str(job)]), (job, [str(job)]), (third, [f"afternotok:{job}"])):
        cycle = client.patch(f"/v1/jobs/{target}", json={"depends_on": deps}, headers=h)
        assert (cycle.status_code, cycle.headers["content-type"]) == (422, "application/problem+json"), cycle.text
        assert "would wait for itself" in cycle.json()["detail"]
    other_team = client.patch(f"/v1/jobs/{job}", json={"depends_on": [str(world.jobs["beta"])]}, headers=h)
    assert other_team.status_code == 422 and "no job" in other_team.json()["detail"]

    cleared = client.patch(f"/v1/jobs/{job}", json={"depends_on": []}, headers=h)
    assert cleared.status_code == 200 and cleared.json()["spec"]["depends_on"] == []
    assert db.scalars(select(JobDependency).where(JobDependency.job_id == job)).first() is None
