"""Holding a queued job (kiln hold, Slurm's scontrol hold) and releasing it, on PostgreSQL: the scheduler leaves a
held job be, even one held after its snapshot was taken; the hold pauses the wait the queue-wait SLA and the
policy's backlog bound count; the API answers who may hold and what can be held."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.lifecycle import ExitClass, end_attempt_as, requeue_after_failure
from core.models import Event, Job
from core.policy_config import PolicyConfig
from core.settings import Settings
from core.states import JobState
from core.transitions import hold, release, transition
from scheduler.live import sla
from scheduler.live.apply import apply_all
from scheduler.live.loader import load_snapshot
from scheduler.policy.plan import plan
from tests.integration import test_scheduler_support as f
from tests.integration.test_scheduler_loop import cycle, dispatched  # noqa: F401  (fixture)
from tests.integration.test_scheduler_sla import contract, violations
from tests.support.api import World, spec

pytestmark = [pytest.mark.integration]

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def held(db: Session, job: Job, seconds: float, *, reason: str | None = None) -> None:
    hold(db, job, by="mark", reason=reason, actor_user_id=None, now=at(seconds))
    db.flush()


def released(db: Session, job: Job, seconds: float) -> None:
    release(db, job, by="mark", actor_user_id=None, now=at(seconds))
    db.flush()


@pytest.mark.usefixtures("dispatched")
def test_a_held_job_does_not_start_until_released(db: Session) -> None:
    gold = f.qos(db, "gold")
    f.host(db, "h1", 1, now=T0)
    job = f.job(db, f.team(db, "hold-a"), gold, gpus=1, name="held", submitted_at=T0)
    held(db, job, 1, reason="dataset not ready")

    for t in (2, 60):
        assert cycle(db, at(t)).admitted == []  # the GPU is free all along
    job = db.get(Job, job.id)  # type: ignore[assignment]
    assert (job.state, job.pending_reason, job.pending_message) == ("QUEUED", "Held", "held by mark: dataset not ready")
    released(db, job, 100)
    assert (job.pending_reason, job.held_at) == (None, None)
    assert cycle(db, at(101)).admitted == [job.id]


@pytest.mark.usefixtures("dispatched")
def test_a_job_held_after_the_snapshot_is_neither_admitted_nor_given_the_plans_reason(db: Session) -> None:
    """The cycle plans from a snapshot; a hold written before its decisions are applied wins (apply re-reads the
    job under its row lock), as a cancel does."""
    gold = f.qos(db, "gold")
    f.host(db, "h1", 1, now=T0)
    team = f.team(db, "hold-b")
    first = f.job(db, team, gold, gpus=1, name="first", submitted_at=T0)
    second = f.job(db, team, gold, gpus=1, name="second", submitted_at=at(1))
    cycle(db, at(2))  # first is admitted; second waits with the plan's reason
    transition(db, db.get(Job, first.id), JobState.CANCELLED, now=at(3))  # type: ignore[arg-type]
    first_plan = plan(load_snapshot(db=db, now=at(4)), PolicyConfig())
    assert [a.job_id for a in first_plan.admissions] == [second.id]
    late = f.job(db, team, gold, gpus=2, name="late", submitted_at=at(3))  # waits: 2 GPUs on a 1-GPU host
    later_plan = plan(load_snapshot(db=db, now=at(4)), PolicyConfig())
    assert late.id in {p.job_id for p in later_plan.pending}

    held(db, db.get(Job, second.id), 5)  # type: ignore[arg-type]
    held(db, late, 5)
    applied = apply_all(db=db, decisions=first_plan, now=at(6))
    applied_later = apply_all(db=db, decisions=later_plan, now=at(6))
    assert applied.admitted == [] and applied_later.reasons_written == 0
    db.expire_all()
    assert [(j.state, j.pending_reason) for j in (db.get(Job, second.id), db.get(Job, late.id))] == [
        ("QUEUED", "Held"),
        ("QUEUED", "Held"),
    ]


@pytest.mark.usefixtures("dispatched")
def test_held_time_is_not_queue_wait(db: Session) -> None:
    """600 s budget: 100 s waiting, 2,000 s held, 150 s waiting after the release: 250 s in all, no violation."""
    gold = f.qos(db, "gold")
    job = f.job(db, f.team(db, "hold-c"), gold, gpus=1, name="held", submitted_at=T0)
    contract(db, job, max_queue_wait_s=600.0)
    held(db, job, 100)
    assert sla.evaluate(db=db, now=at(2000)) == []
    released(db, job, 2100)
    (pending,) = [p for p in load_snapshot(db=db, now=at(2200)).pending if p.id == job.id]
    assert pending.max_queue_wait_s == pytest.approx(500.0)  # what the first 100 s left of the budget
    assert pending.queue_wait_due == pytest.approx(at(2100).timestamp() + 500.0)
    f.host(db, "h1", 1, now=at(2250))
    assert cycle(db, at(2250)).admitted == [job.id]
    assert db.get(Job, job.id).queued_s == pytest.approx(250.0)  # type: ignore[union-attr]
    assert violations(db, job) == []


def test_a_release_does_not_jump_the_queue_by_the_time_held(db: Session) -> None:
    """The backlog bound counts the time a job could have started: held for a day, a job waits as one submitted a day
    later."""
    gold = f.qos(db, "gold")
    job = f.job(db, f.team(db, "hold-d"), gold, gpus=1, name="held", submitted_at=T0)
    held(db, job, 60)
    released(db, job, 60 + 86400)
    (pending,) = [p for p in load_snapshot(db=db, now=at(86500)).pending if p.id == job.id]
    assert pending.submitted_at == pytest.approx(T0.timestamp() + 86400)


def running(db: Session, team: str, host: str) -> tuple[Job, Any]:
    """A gold job alone on the one-GPU ``host``: admitted at T0 + 1 s, running from T0 + 2 s."""
    f.host(db, host, 1, now=T0)
    job = f.job(db, f.team(db, team), f.qos(db, "gold"), gpus=1, name="runs", submitted_at=T0)
    cycle(db, at(1))
    return job, f.start(db, job, now=at(2))


@pytest.mark.usefixtures("dispatched")
def test_a_running_job_held_stops_checkpoint_first_and_waits_held_in_the_queue(db: Session) -> None:
    """Slurm's requeuehold: the worker is asked to stop (as for a preemption: the trainer checkpoints on SIGTERM);
    the job comes back to the queue held, no preemption recorded, and resumes once released."""
    job, attempt = running(db, "hold-run", "h1")
    held(db, job, 100, reason="free the GPU for a demo")
    assert (job.state, job.preempt_requested, job.pending_reason) == ("RUNNING", True, "Held")
    assert cycle(db, at(101)).preempted == []  # not a preemption: nothing else recorded, the worker stops it
    end_attempt_as(
        db,
        job=job,
        attempt=attempt,
        exit_class=ExitClass.PREEMPTED,
        reason="held by the user",
        now=at(110),
        exit_code=None,
        data={},
        settings=Settings(),
    )
    message = "held by mark: free the GPU for a demo"
    assert (job.state, job.pending_reason, job.pending_message) == ("QUEUED", "Held", message)
    # held, and its wait paused, from the requeue (dated by the worker's clock: core.lifecycle passes its now)
    assert job.held_at == at(110) and job.wait_started_at is None
    assert [e.type for e in violations(db, job)] == [] and not job_events(db, job, "PREEMPTING")
    assert [e.message for e in job_events(db, job, "QUEUED")] == [
        "stopped at step 0; back in the queue, held until released"
    ]
    assert cycle(db, at(200)).admitted == []  # its GPU is free
    released(db, job, 300)
    assert cycle(db, at(301)).admitted == [job.id]
    # Resumed, it has run 108 s before: its time limit and kiln's estimate of what is left count them.
    f.start(db, job, now=at(302))
    (resumed,) = [r for r in load_snapshot(db=db, now=at(400)).running if r.id == job.id]
    assert resumed.attained_s == pytest.approx(108.0)


@pytest.mark.usefixtures("dispatched")
def test_a_running_job_released_before_its_worker_stopped_it_keeps_running(db: Session) -> None:
    job, _attempt = running(db, "hold-undo", "h1")
    held(db, job, 100)
    released(db, job, 101)
    assert (job.state, job.preempt_requested, job.held_at, job.pending_reason) == ("RUNNING", False, None, None)


@pytest.mark.usefixtures("dispatched")
def test_a_held_running_job_that_loses_its_host_comes_back_held(db: Session) -> None:
    job, attempt = running(db, "hold-lost", "h1")
    held(db, job, 100)
    requeue_after_failure(db, job=job, attempt=attempt, reason="lease expired", now=at(120), settings=Settings())
    assert (job.state, job.restart_count, job.pending_reason) == ("QUEUED", 1, "Held") and job.held_at > at(100)
    assert cycle(db, at(400)).admitted == []  # past its restart backoff, still held


def job_events(db: Session, job: Job, type_: str) -> list[Event]:
    return list(db.scalars(select(Event).where(Event.job_id == job.id, Event.type == type_).order_by(Event.id)))


def test_cancelling_a_held_job_ends_its_hold(db: Session) -> None:
    gold = f.qos(db, "gold")
    job = f.job(db, f.team(db, "hold-e"), gold, gpus=1, name="held", submitted_at=T0)
    held(db, job, 10)
    transition(db, job, JobState.CANCELLED, now=at(70))
    assert (job.held_at, job.held_s, job.queued_s, job.pending_reason) == (None, 60.0, 10.0, None)


def _state(r: Any) -> tuple[int, str, bool, str | None]:
    body = r.json()
    return r.status_code, body.get("state"), body.get("held_at") is not None, body.get("pending_reason")


def test_the_api_holds_and_releases_a_queued_job(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    job = world.jobs["alpha"]
    assert _state(client.post(f"/v1/jobs/{job}/hold", json={"reason": "data"}, headers=h)) == (
        200,
        "QUEUED",
        True,
        "Held",
    )
    assert _state(client.post(f"/v1/jobs/{job}/hold", headers=h))[2]  # held again: unchanged, not an error
    page = client.get("/v1/jobs", params={"team": "alpha"}, headers=h).json()["items"]
    assert [j["held_at"] is not None for j in page if j["id"] == job] == [True]
    other = client.post("/v1/jobs", json=spec(name="not-held"), headers=h).json()["id"]
    for held, ids in (("true", [job]), ("false", [other])):
        found = client.get("/v1/jobs", params={"team": "alpha", "held": held}, headers=h).json()["items"]
        assert [j["id"] for j in found] == ids
    one = client.get(f"/v1/jobs/{job}", headers=h).json()
    assert one["waiting_since"] is None and one["pending_message"] == "held by mark: data"
    why = client.get(f"/v1/jobs/{job}/why", headers=h).json()
    assert why["unblock"] == [f"release it: kiln release {job} (it was held by mark: data)"]
    assert why["expected_start_basis"].startswith("cannot be known: it is held")

    assert _state(client.post(f"/v1/jobs/{job}/release", headers=world.h("team-admin"))) == (200, "QUEUED", False, None)
    assert _state(client.post(f"/v1/jobs/{job}/release", headers=h))[0] == 200  # not held: unchanged
    assert client.get(f"/v1/jobs/{job}", headers=h).json()["waiting_since"] is not None
    events = client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"]
    assert [(e["type"], e["actor"]) for e in events] == [("SUBMITTED", "mark"), ("HELD", "mark"), ("RELEASED", "alice")]


def test_the_api_refuses_what_cannot_be_held(client: TestClient, world: World, db: Session) -> None:
    job = world.jobs["alpha"]
    for role, status in (("viewer", 403), ("beta-member", 404)):
        r = client.post(f"/v1/jobs/{job}/hold", headers=world.h(role))
        assert (r.status_code, r.headers["content-type"]) == (status, "application/problem+json"), r.text
    row = db.get(Job, job)
    assert row is not None
    transition(db, row, JobState.ADMITTED)
    transition(db, row, JobState.RUNNING)
    row.cancel_requested = True
    db.flush()
    r = client.post(f"/v1/jobs/{job}/hold", headers=world.h("member"))
    assert r.status_code == 409 and r.json()["detail"] == (
        f"job {job} is RUNNING and stopping: only a queued or running job can be held"
    )
    ended = client.post("/v1/jobs", json=spec(name="ended"), headers=world.h("member")).json()["id"]
    client.post(f"/v1/jobs/{ended}/cancel", headers=world.h("member"))
    for action in ("hold", "release"):
        assert client.post(f"/v1/jobs/{ended}/{action}", headers=world.h("member")).status_code == 409


def test_a_job_submitted_held_waits_for_its_release(client: TestClient, world: World) -> None:
    h = world.h("member")
    r = client.post("/v1/jobs", params={"hold": "true"}, json=spec(name="later"), headers=h)
    assert r.status_code == 201 and r.json()["held_at"] is not None and r.json()["pending_reason"] == "Held"
    assert r.json()["waiting_since"] is None
    stored = client.get(f"/v1/jobs/{r.json()['id']}", headers=h).json()
    assert (stored["pending_message"], stored["held_at"]) == ("held by mark at submission", r.json()["held_at"])
    events = client.get(f"/v1/jobs/{r.json()['id']}/events", headers=h).json()["items"]
    assert events[0]["data"]["held"] is True and events[0]["message"].endswith(", held")


def test_the_queue_page_puts_held_jobs_last_without_a_position(client: TestClient, world: World, db: Session) -> None:
    h = world.h("member")
    first = world.jobs["alpha"]
    later = [client.post("/v1/jobs", json=spec(name=f"after-{i}"), headers=h).json()["id"] for i in range(2)]
    assert client.post(f"/v1/jobs/{first}/hold", headers=h).status_code == 200
    rows = client.get("/v1/dashboard/queue", params={"view": "waiting", "team": "alpha"}, headers=h).json()["items"]
    assert [(r["id"], r["position"], r["pending_reason"]) for r in rows] == [
        (later[0], 2, None),
        (later[1], 3, None),
        (first, None, "Held"),
    ]
    # The summary's oldest wait is the oldest job not held: held since submission, the first does not count.
    for job_id, minutes in ((first, 600), (later[0], 5), (later[1], 1)):
        row = db.get(Job, job_id)
        assert row is not None
        row.submitted_at = datetime.now(UTC) - timedelta(minutes=minutes)
    db.flush()
    groups = client.get("/v1/dashboard/queue/summary", headers=h).json()["groups"]
    (alpha,) = [g for g in groups if g["team"] == "alpha"]
    assert 290 < alpha["oldest_wait_s"] < 400


def test_a_team_admins_hold_is_released_by_a_team_admin_only(client: TestClient, world: World) -> None:
    """Slurm's admin hold: a member's hold any member may release; a team admin's only a team admin (or an admin)."""
    job = world.jobs["alpha"]
    held_by_admin = client.post(f"/v1/jobs/{job}/hold", json={"reason": "over budget"}, headers=world.h("team-admin"))
    assert held_by_admin.json()["pending_message"] == "held by alice (team admin): over budget"
    refused = client.post(f"/v1/jobs/{job}/release", headers=world.h("member"))
    assert (refused.status_code, refused.headers["content-type"]) == (403, "application/problem+json")
    assert "only a team admin or an admin releases it" in refused.json()["detail"]
    assert client.get(f"/v1/jobs/{job}", headers=world.h("member")).json()["held_at"] is not None
    assert client.post(f"/v1/jobs/{job}/release", headers=world.h("admin")).json()["held_at"] is None
    # Once released, the next hold is whoever's makes it: a member's, which a member releases.
    client.post(f"/v1/jobs/{job}/hold", headers=world.h("member"))
    assert client.post(f"/v1/jobs/{job}/release", headers=world.h("member")).status_code == 200
