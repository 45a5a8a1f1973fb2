"""Jobs through the API against PostgreSQL, each test in a rolled-back transaction."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Attempt, Checkpoint, Event, Job, JobDependency, JobMetric, SlaContract
from core.repositories import step_times
from core.states import JobState
from core.transitions import transition
from tests.support.api import World, spec

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


def _problem(r: Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["status"] == status and body["type"].startswith("https://kiln.dev/problems/")
    return body


def test_submit_json_creates_queued_job_with_event_and_contract(client: TestClient, world: World, db: Session) -> None:
    r = client.post("/v1/jobs", json=spec(name="j1", steps=77), headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert {k: job[k] for k in ("name", "team", "user", "state", "qos", "priority", "gpus", "gpu_type", "steps")} == {
        "name": "j1",
        "team": "alpha",
        "user": "mark",
        "state": "QUEUED",
        "qos": "silver",
        "priority": 500,
        "gpus": 0,
        "gpu_type": "cpu",
        "steps": 77,
    }
    assert job["spec"]["recipe"]["name"] == "gpt" and job["spec"]["parallelism"] == "auto"  # defaults filled in
    events = db.scalars(select(Event).where(Event.job_id == job["id"])).all()
    assert [e.type for e in events] == ["SUBMITTED"]
    assert events[0].actor_user_id == world.users["member"].id
    contract = db.scalars(select(SlaContract).where(SlaContract.job_id == job["id"])).one()
    assert contract.qos_class.name == "silver"


def test_effective_contract_merges_team_default_with_spec_overrides(client: TestClient, world: World) -> None:
    grant = {"qos_classes": ["gold", "silver", "bronze"]}
    granted = client.patch("/v1/teams/alpha", json=grant, headers=world.h("admin"))
    assert granted.status_code == 200 and granted.json()["qos_classes"] == ["gold", "silver", "bronze"]
    r = client.put(
        "/v1/teams/alpha/sla",
        json={"qos": "gold", "max_restarts": 5, "max_queue_wait_s": 900},
        headers=world.h("team-admin"),
    )
    assert r.status_code == 200, r.text
    r = client.post("/v1/jobs", json=spec(sla={"max_queue_wait_s": 60}), headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["qos"], job["priority"]) == ("gold", 1000)
    sla = client.get(f"/v1/jobs/{job['id']}/sla", headers=world.h("viewer")).json()
    assert (sla["qos"], sla["max_restarts"], sla["max_queue_wait_s"], sla["job_id"]) == ("gold", 5, 60.0, job["id"])
    r = client.post("/v1/jobs", json=spec(sla={"qos": "bronze"}), headers=world.h("member"))
    assert (r.json()["qos"], r.json()["priority"]) == ("bronze", 200)


@pytest.mark.parametrize("ctype", ["application/yaml", "application/x-yaml", "text/yaml; charset=utf-8"])
def test_submit_yaml(client: TestClient, world: World, ctype: str) -> None:
    body = yaml.safe_dump(spec(name="from-yaml"))
    r = client.post("/v1/jobs", content=body, headers={**world.h("member"), "content-type": ctype})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "from-yaml"


def test_submit_example_file(client: TestClient, world: World) -> None:
    text = Path("examples/gpt-tiny.yaml").read_text()
    r = client.post("/v1/jobs", content=text, headers={**world.h("admin"), "content-type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert (r.json()["team"], r.json()["steps"], r.json()["qos"]) == ("default", 60, "silver")


def test_submit_rejections_are_problems_with_field_paths(client: TestClient, world: World) -> None:
    h = world.h("member")
    body = _problem(client.post("/v1/jobs", json=spec(resources={"gpuz": 1}), headers=h), 422)
    assert body["errors"][0]["loc"] == "resources.gpuz"
    body = _problem(client.post("/v1/jobs", json=spec(sla={"qos": "platinum"}), headers=h), 422)
    assert body["errors"] == [{"loc": "sla.qos", "msg": "unknown QoS class 'platinum'", "type": "value_error"}]
    body = _problem(client.post("/v1/jobs", json=spec(resources={"gpus": -1}), headers=h), 422)
    assert body["errors"][0]["loc"] == "resources.gpus"
    body = _problem(client.post("/v1/jobs", json=spec(steps=10**30), headers=h), 422)
    assert body["errors"][0]["loc"] == "steps"
    body = _problem(
        client.post("/v1/jobs", content="name: [unclosed", headers={**h, "content-type": "application/yaml"}), 422
    )
    assert body["detail"] == "malformed YAML at line 1, column 16"
    assert body["errors"] == [
        {
            "loc": "line 1, column 16",
            "type": "yaml",
            "msg": "did not find expected ',' or ']' (while parsing a flow sequence from line 1, column 7)",
        }
    ]  # libyaml's words
    _problem(client.post("/v1/jobs", content="{not json", headers={**h, "content-type": "application/json"}), 422)
    _problem(client.post("/v1/jobs", content="name: x", headers={**h, "content-type": "text/plain"}), 415)
    bomb = "a: &a [1, 1]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    _problem(client.post("/v1/jobs", content=bomb, headers={**h, "content-type": "application/yaml"}), 422)
    _problem(client.post("/v1/jobs", json=["not", "a", "mapping"], headers=h), 422)
    _problem(client.post("/v1/jobs", json=spec(team="nowhere"), headers=h), 404)


def test_depends_on_must_name_jobs_of_the_same_team(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    body = _problem(client.post("/v1/jobs", json=spec(depends_on=[str(world.jobs["beta"])]), headers=h), 422)
    assert body["errors"][0]["loc"] == "depends_on.0"
    body = _problem(client.post("/v1/jobs", json=spec(depends_on=[str(world.jobs["alpha"]), "x1"]), headers=h), 422)
    assert body["errors"][0]["loc"] == "depends_on.1"
    r = client.post("/v1/jobs", json=spec(depends_on=[str(world.jobs["alpha"])]), headers=h)
    assert r.status_code == 201, r.text
    deps = db.scalars(select(JobDependency.depends_on_id).where(JobDependency.job_id == r.json()["id"])).all()
    assert deps == [world.jobs["alpha"]]


def test_list_keyset_pages_newest_first_with_filters(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    ids = [client.post("/v1/jobs", json=spec(name="paged"), headers=h).json()["id"] for _ in range(7)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"name": "paged", "limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/jobs", params=params, headers=h).json()
        seen += [j["id"] for j in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True) and pages == 3
    job = db.get(Job, ids[0])
    assert job is not None
    transition(db, job, JobState.ADMITTED)
    db.flush()
    r = client.get("/v1/jobs", params={"state": ["ADMITTED", "RUNNING"], "team": "alpha"}, headers=h)
    assert [j["id"] for j in r.json()["items"]] == [ids[0]]
    r = client.get("/v1/jobs", params={"qos": "gold", "team": "alpha"}, headers=h)
    assert r.json() == {"items": [], "next_cursor": None}
    _problem(client.get("/v1/jobs", params={"state": "SLEEPING"}, headers=h), 422)
    _problem(client.get("/v1/jobs", params={"cursor": "bogus!"}, headers=h), 422)
    _problem(client.get("/v1/jobs", params={"limit": 0}, headers=h), 422)


def test_list_by_submission_time(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    ids = [client.post("/v1/jobs", json=spec(name="dated"), headers=h).json()["id"] for _ in range(3)]
    day = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
    for i, job_id in enumerate(ids):  # submitted on 2, 3 and 4 November at noon UTC
        job = db.get(Job, job_id)
        assert job is not None
        job.submitted_at = day + timedelta(days=i)
    db.flush()

    def listed(**window: str) -> list[int]:
        r = client.get("/v1/jobs", params={"name": "dated", **window}, headers=h)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["items"]]

    assert listed(submitted_after="2026-11-03T12:00:00Z") == [ids[2], ids[1]]  # at or after
    assert listed(submitted_before="2026-11-03T12:00:00Z") == [ids[0]]  # strictly before
    assert listed(submitted_after="2026-11-03T00:00:00", submitted_before="2026-11-04T00:00:00") == [ids[1]]  # UTC
    assert listed(submitted_after="2026-11-03T13:30:00+02:00") == [ids[2], ids[1]]  # 11:30 UTC
    body = _problem(
        client.get("/v1/jobs", params={"submitted_after": "2026-11-04", "submitted_before": "2026-11-03"}, headers=h),
        422,
    )
    assert body["errors"][0]["loc"] == "submitted_before"
    _problem(client.get("/v1/jobs", params={"submitted_after": "last tuesday"}, headers=h), 422)


def test_list_without_filter_shows_only_own_teams(client: TestClient, world: World) -> None:
    teams = {j["team"] for j in client.get("/v1/jobs", headers=world.h("viewer")).json()["items"]}
    assert teams == {"alpha"}
    teams = {j["team"] for j in client.get("/v1/jobs", headers=world.h("admin")).json()["items"]}
    assert teams == {"alpha", "beta"}


def test_cancel_queued_at_once_and_running_by_request(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    queued = world.jobs["alpha"]
    r = client.post(f"/v1/jobs/{queued}/cancel", json={"reason": "wrong lr"}, headers=h)
    assert r.status_code == 202 and r.json()["state"] == "CANCELLED" and r.json()["finished_at"]
    _problem(client.post(f"/v1/jobs/{queued}/cancel", headers=h), 409)
    events = client.get(f"/v1/jobs/{queued}/events", headers=h).json()["items"]
    assert [e["type"] for e in events] == ["SUBMITTED", "CANCELLED"]
    assert "wrong lr" in events[1]["message"] and events[1]["actor"] == "mark"
    # the reason is kept on the job, which describe and why show (it was in the event's message only)
    assert client.get(f"/v1/jobs/{queued}", headers=h).json()["exit_reason"] == "cancelled by mark: wrong lr"
    assert client.get(f"/v1/jobs/{queued}/why", headers=h).json()["exit_reason"] == "cancelled by mark: wrong lr"

    running_id = client.post("/v1/jobs", json=spec(name="running"), headers=h).json()["id"]
    job = db.get(Job, running_id)
    assert job is not None
    transition(db, job, JobState.ADMITTED)
    transition(db, job, JobState.RUNNING)
    db.flush()
    for _ in range(2):
        r = client.post(f"/v1/jobs/{running_id}/cancel", json={"reason": "out of budget"}, headers=h)
        assert r.status_code == 202, r.text
        assert (r.json()["state"], r.json()["cancel_requested"]) == ("RUNNING", True)
    types = [e["type"] for e in client.get(f"/v1/jobs/{running_id}/events", headers=h).json()["items"]]
    assert types == ["SUBMITTED", "ADMITTED", "RUNNING", "CANCEL_REQUESTED"]
    assert job.exit_reason == "cancelled by mark: out of budget"  # what the worker's CANCELLED will say (stop_cause)


def test_events_keyset_after(client: TestClient, world: World) -> None:
    h = world.h("member")
    job = world.jobs["alpha"]
    client.post(f"/v1/jobs/{job}/cancel", headers=h)
    first = client.get(f"/v1/jobs/{job}/events", params={"limit": 1}, headers=h).json()
    assert len(first["items"]) == 1 and first["next_cursor"] is not None  # more to read
    rest = client.get(f"/v1/jobs/{job}/events", params={"after": first["next_after"]}, headers=h).json()
    assert [e["type"] for e in rest["items"]] == ["CANCELLED"]
    empty = client.get(f"/v1/jobs/{job}/events", params={"after": rest["next_after"]}, headers=h).json()
    assert empty == {"items": [], "next_after": None, "next_cursor": None}


def _attempt(db: Session, job_id: int, number: int = 1) -> Attempt:
    attempt = Attempt(job_id=job_id, number=number, fencing_token=number, placement=[{"host": "h1", "slots": 1}])
    db.add(attempt)
    db.flush()
    return attempt


def test_attempts_checkpoints_metrics_why(client: TestClient, world: World, db: Session) -> None:
    h = world.h("viewer")
    job_id = world.jobs["alpha"]
    attempt = _attempt(db, job_id)
    db.add(Checkpoint(job_id=job_id, attempt_id=attempt.id, step=20, path="/x/20", bytes=10, sha256="a" * 64))
    db.add_all(JobMetric(job_id=job_id, attempt_id=attempt.id, step=s, loss=10.0 - s / 100) for s in range(1, 101))
    job = db.get(Job, job_id)
    assert job is not None
    job.pending_reason, job.pending_message = "Quota", "alpha: 4/4 cpu slots in use"
    db.flush()
    attempts = client.get(f"/v1/jobs/{job_id}/attempts", headers=h).json()["items"]
    assert [(a["number"], a["state"]) for a in attempts] == [(1, "PENDING")]
    ckpts = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=h).json()["items"]
    assert [(c["step"], c["verified"]) for c in ckpts] == [(20, False)]
    all_points = client.get(f"/v1/jobs/{job_id}/metrics", headers=h).json()["items"]
    assert [p["step"] for p in all_points] == list(range(1, 101))
    thin = client.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 10}, headers=h).json()["items"]
    steps = [p["step"] for p in thin]
    assert len(steps) <= 10 and steps[0] == 1 and steps[-1] == 100 and steps == sorted(steps)
    after = client.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": 95}, headers=h).json()["items"]
    assert [p["step"] for p in after] == [96, 97, 98, 99, 100]
    one = client.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 1}, headers=h).json()["items"]
    assert [p["step"] for p in one] == [100]
    why = client.get(f"/v1/jobs/{job_id}/why", headers=h).json()
    assert why == {
        "state": "QUEUED",
        "pending_reason": "Quota",
        "pending_message": "alpha: 4/4 cpu slots in use",
        "unblock": [
            "the team's quota: alpha uses 0 of its 4 CPU slots; an admin raises it (kiln teams set "
            "alpha --quota cpu=N), or its running jobs end"
        ],
        "expected_start": None,
        "expected_start_latest": None,
        "expected_start_hosts": [],
        "expected_start_basis": "cannot be known: it does not start even once every running job has "
        "ended (its pending reason says what holds it)",
        "exit_reason": None,
    }


def _sse_events(text: str) -> list[tuple[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and line[0] != ":")
        out.append((fields.get("event", ""), fields.get("data", "")))
    return out


def test_logs_sse_reads_the_attempt_file_and_ends(
    client: TestClient, world: World, db: Session, tmp_path: Path
) -> None:
    h = world.h("member")
    job_id = world.jobs["alpha"]
    _attempt(db, job_id)
    log = tmp_path / "storage" / "logs" / str(job_id) / "1.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 1 loss 4.2\nstep 2 loss 3.9\npartial")
    r = client.get(f"/v1/jobs/{job_id}/logs", headers=h)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(r.text)
    assert events[:3] == [("log", "step 1 loss 4.2"), ("log", "step 2 loss 3.9"), ("log", "partial")]
    assert events[-1][0] == "end" and '"state": "QUEUED"' in events[-1][1]
    job = db.get(Job, job_id)
    assert job is not None
    transition(db, job, JobState.CANCELLED)
    db.flush()
    with client.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=h) as s:
        text = "".join(s.iter_text())
    assert _sse_events(text)[-1] == ("end", '{"attempt": 1, "state": "CANCELLED"}')
    _problem(client.get(f"/v1/jobs/{world.jobs['beta']}/logs", headers=h), 404)


def test_unknown_job_is_404_problem(client: TestClient, world: World) -> None:
    for path in ("", "/events", "/attempts", "/checkpoints", "/metrics", "/why", "/sla", "/logs"):
        _problem(client.get(f"/v1/jobs/999999{path}", headers=world.h("admin")), 404)
    _problem(client.post("/v1/jobs/999999/cancel", headers=world.h("admin")), 404)


def test_metrics_endpoint_counts_jobs_by_state(client: TestClient, world: World) -> None:
    client.get("/v1/jobs", headers=world.h("member"))
    text = client.get("/metrics", headers=world.h("admin")).text  # an admin's token may scrape
    assert 'kiln_jobs{state="QUEUED"} 2.0' in text
    assert 'kiln_http_requests_total{method="GET",route="/v1/jobs",status="200"}' in text
    assert "kiln_http_request_duration_seconds_bucket" in text


def test_script_mode_submissions_are_checked_with_field_paths(client: TestClient, world: World) -> None:
    h = world.h("member")
    base = {k: v for k, v in spec().items() if k != "recipe"}
    body = _problem(client.post("/v1/jobs", json=base, headers=h), 422)
    assert "either a `recipe:`" in body["errors"][0]["msg"] and "or a `command:`" in body["errors"][0]["msg"]
    body = _problem(client.post("/v1/jobs", json={**spec(), "command": ["python", "t.py"]}, headers=h), 422)
    assert "not both" in body["errors"][0]["msg"]
    body = _problem(client.post("/v1/jobs", json={**base, "command": ["python", "t.py"]}, headers=h), 422)
    assert body["errors"][0]["loc"] == "code.digest" and "kiln submit --workdir" in body["errors"][0]["msg"]
    body = _problem(client.post("/v1/jobs", json={**base, "command": []}, headers=h), 422)
    assert body["errors"][0]["loc"] == "command"


def test_the_step_time_term_is_unmeasured_until_the_pace_could_be_compared(
    client: TestClient, world: World, db: Session
) -> None:
    h = world.h("viewer")
    job_id = world.jobs["alpha"]
    assert client.get(f"/v1/jobs/{job_id}/sla", headers=h).json()["standing"] == {"step_time_tolerance": "unmeasured"}

    def unmeasured_on_the_sla_page() -> int:
        page = client.get("/v1/sla/attainment", params={"days": 1}, headers=h).json()
        return sum(s["step_time_unmeasured"] for s in page["series"] if s["team"] == "alpha")

    assert unmeasured_on_the_sla_page() == 0  # not started: nothing to measure yet
    started = db.get(Job, job_id)
    assert started is not None
    started.started_at = started.submitted_at
    db.flush()
    assert unmeasured_on_the_sla_page() == 1  # it ran, and reported no step time yet
    attempt = _attempt(db, job_id)
    db.add(JobMetric(job_id=job_id, attempt_id=attempt.id, step=1, loss=1.0))  # a step without its time
    db.flush()
    assert client.get(f"/v1/jobs/{job_id}/sla", headers=h).json()["standing"] == {"step_time_tolerance": "unmeasured"}
    # Steps with their times, but too brief for a baseline and a recent window: 125 steps over 12.4 s. (Before,
    # one step with its time made the term "met" though nothing was ever compared.)
    t0 = started.submitted_at
    for step in range(2, 2 + step_times.MEASURABLE_STEPS):
        db.add(
            JobMetric(
                job_id=job_id,
                attempt_id=attempt.id,
                step=step,
                loss=1.0,
                step_time_s=0.1,
                ts=t0 + timedelta(seconds=0.1 * step),
            )
        )
    db.flush()
    assert client.get(f"/v1/jobs/{job_id}/sla", headers=h).json()["standing"] == {"step_time_tolerance": "unmeasured"}
    assert unmeasured_on_the_sla_page() == 1
    last = t0 + timedelta(seconds=step_times.MEASURABLE_S + 1)
    db.add(JobMetric(job_id=job_id, attempt_id=attempt.id, step=200, loss=1.0, step_time_s=0.1, ts=last))
    db.flush()
    assert client.get(f"/v1/jobs/{job_id}/sla", headers=h).json()["standing"] == {"step_time_tolerance": "met"}
    assert unmeasured_on_the_sla_page() == 0
    job = db.get(Job, job_id)
    assert job is not None
    db.add(Event(job_id=job_id, team_id=job.team_id, type="SLA_STEP_TIME_VIOLATION", message="slow"))
    db.flush()
    assert client.get(f"/v1/jobs/{job_id}/sla", headers=h).json()["standing"] == {"step_time_tolerance": "violated"}
    overview = client.get(f"/v1/dashboard/jobs/{job_id}", headers=h).json()
    assert overview["contract"]["standing"] == {"step_time_tolerance": "violated"}
