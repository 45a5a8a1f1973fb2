"""Adaptive sweeps (``search: tpe``) through the API and the scheduler's cycle, on PostgreSQL: the first random draws
at submit, each next job proposed as others end, and the search closed by its count, a cancel or a refusal."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Job, Membership, Webhook, WebhookDelivery
from core.outbox import deliver_events
from core.states import JobState
from core.transitions import transition
from tests.integration.test_scheduler_loop import cycle, dispatched  # noqa: F401  (fixture)
from tests.support.api import World, spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("dispatched")]

SPACE = {"lr": {"log_uniform": [1e-4, 1e-2]}, "steps": [10, 20]}


def submit(client: TestClient, world: World, **section: object) -> dict[str, object]:
    doc = {**spec(team="alpha", name="lr"), "sweep": {"random": SPACE, "search": "tpe", "seed": 11, **section}}
    r = client.post("/v1/sweeps", json=doc, headers=world.h("member"))
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def jobs_of(db: Session, sweep_id: object) -> list[Job]:
    return list(db.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.id)))


def end(job: Job, state: JobState, loss: float | None = None) -> None:
    job.state, job.last_loss = state.value, loss


def test_each_next_job_is_proposed_as_others_end_until_its_count(db: Session, client: TestClient, world: World) -> None:
    sweep = submit(client, world, count=5, initial=2)
    assert sweep["search"] == (
        "TPE (tree-structured Parzen estimators): 2 random draws, then each next job's settings "
        "proposed from the jobs that ended, 2 at a time, 5 jobs in all"
    )
    assert sweep["search_closed"] is None and len(sweep["jobs"]) == 2  # type: ignore[arg-type]
    now = utcnow()
    assert cycle(db, now).proposed == []  # both unfinished: 2 at a time
    first = jobs_of(db, sweep["id"])
    end(first[0], JobState.SUCCEEDED, 2.1)
    end(first[1], JobState.SUCCEEDED, 3.4)
    db.flush()
    proposed = cycle(db, now + timedelta(seconds=1)).proposed
    jobs = jobs_of(db, sweep["id"])
    assert proposed == [j.id for j in jobs[2:]] and [j.name for j in jobs] == [f"lr-{i}" for i in range(4)]
    settings = [j.spec["recipe"]["hyperparameters"]["lr"] for j in jobs[2:]]
    assert all(1e-4 <= lr <= 1e-2 for lr in settings) and settings[0] != settings[1]
    assert all(j.spec["steps"] in (10, 20) and j.user_id == world.users["member"].id for j in jobs[2:])
    assert cycle(db, now + timedelta(seconds=2)).proposed == []
    end(jobs[2], JobState.FAILED)
    db.flush()
    (last,) = cycle(db, now + timedelta(seconds=3)).proposed  # the fifth and last
    assert cycle(db, now + timedelta(seconds=4)).proposed == []
    shown = client.get(f"/v1/sweeps/{sweep['id']}", headers=world.h("viewer")).json()
    assert shown["search_closed"] == "all 5 jobs submitted" and last in [j["id"] for j in shown["jobs"]]


def test_a_cancelled_search_proposes_nothing_more(db: Session, client: TestClient, world: World) -> None:
    sweep = submit(client, world, count=4, initial=1)
    cancelled = client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=world.h("member")).json()
    assert cancelled["search_closed"] == "cancelled by mark"
    assert cycle(db, utcnow()).proposed == [] and len(jobs_of(db, sweep["id"])) == 1


def test_a_proposal_its_submitter_may_no_longer_make_closes_the_search(
    db: Session, client: TestClient, world: World
) -> None:
    sweep = submit(client, world, count=4, initial=1)
    (job,) = jobs_of(db, sweep["id"])
    end(job, JobState.SUCCEEDED, 1.0)
    db.execute(delete(Membership).where(Membership.user_id == world.users["member"].id))
    db.flush()
    assert cycle(db, utcnow()).proposed == []  # the cycle itself goes on
    shown = client.get(f"/v1/sweeps/{sweep['id']}", headers=world.h("viewer")).json()
    assert shown["search_closed"] == (
        "its next job could not be submitted: mark, who submitted the sweep, is no longer a member of its team"
    )
    assert len(shown["jobs"]) == 1


def test_sweep_finished_waits_for_the_jobs_the_search_is_still_to_propose(
    db: Session, client: TestClient, world: World
) -> None:
    team_id = jobs_of(db, submit(client, world, count=1, initial=1)["id"])[0].team_id
    db.add(Webhook(team_id=team_id, url="http://127.0.0.1:9/k", secret="whsec_test", events=["sweep_finished"]))
    sweep = submit(client, world, count=3, initial=1)
    now = utcnow()
    for i in range(3):
        job = jobs_of(db, sweep["id"])[-1]
        transition(db, job, JobState.FAILED)
        db.flush()
        deliver_events(db)
        kinds = db.scalars(select(WebhookDelivery.kind)).all()
        assert kinds == (["sweep_finished"] if i == 2 else []), (i, kinds)
        assert len(cycle(db, now + timedelta(seconds=i)).proposed) == (0 if i == 2 else 1)
    # That last cycle closed the search ("all 3 jobs submitted"): the last end had sent it, and nothing sends it again.
    assert db.scalars(select(WebhookDelivery.kind)).all() == ["sweep_finished"]


def test_a_search_closed_early_once_its_jobs_all_ended_sends_sweep_finished(
    db: Session, client: TestClient, world: World
) -> None:
    """Each job's end heard of jobs still to come, so none sent ``sweep_finished``; a cancel of the sweep, or a
    refused proposal, closes the search with no end left to send it: the close sends it, once."""
    team_id = jobs_of(db, submit(client, world, count=1, initial=1)["id"])[0].team_id
    db.add(Webhook(team_id=team_id, url="http://127.0.0.1:9/k", secret="whsec_test", events=["sweep_finished"]))
    cancelled, refused = submit(client, world, count=4, initial=1), submit(client, world, count=4, initial=1)
    for sweep in (cancelled, refused):
        (job,) = jobs_of(db, sweep["id"])
        transition(db, job, JobState.FAILED)
    db.flush()

    def sent() -> list[object]:
        deliver_events(db)  # the ends' events read: the close, not an end, finds each sweep finished
        return [d.payload["sweep"]["id"] for d in db.scalars(select(WebhookDelivery).order_by(WebhookDelivery.id))]

    assert sent() == []  # three jobs to come in each
    client.post(f"/v1/sweeps/{cancelled['id']}/cancel", headers=world.h("member"))
    assert sent() == [cancelled["id"]]
    db.execute(delete(Membership).where(Membership.user_id == world.users["member"].id))
    db.flush()
    cycle(db, utcnow())
    assert sent() == [cancelled["id"], refused["id"]]
    body = next(d.payload for d in db.scalars(select(WebhookDelivery)) if d.payload["sweep"]["id"] == refused["id"])
    assert body["sweep"]["failed"] == 1 and body["event"]["type"] == "FAILED"
    cycle(db, utcnow() + timedelta(seconds=1))
    assert len(sent()) == 2


def test_a_cancel_racing_a_proposal_cancels_the_proposed_job_too() -> None:
    """The cycle holds the sweep's row while it proposes; a cancel of the sweep, which closes it before it reads its
    jobs, waits for that cycle and then cancels the job it proposed as well (before, the job was read too early and
    ran on after the sweep was cancelled)."""
    import threading

    from sqlalchemy.orm import sessionmaker

    from core.db import make_engine
    from core.migrate import upgrade
    from core.models import User
    from core.services import teams as teams_svc
    from core.services.principal import Principal
    from core.sweeps.search import propose_due
    from core.sweeps.service import cancel_all, submit_sweep
    from harness.services import temporary_database

    with temporary_database("kiln_sweep_race") as url:
        upgrade(url)
        engine = make_engine(url)
        factory = sessionmaker(bind=engine, expire_on_commit=False)
        with factory() as db:
            user = User(name="root", is_admin=True)
            db.add(user)
            db.flush()
            root = Principal(
                user_id=user.id, name="root", user_is_admin=True, scopes=frozenset({"read", "write", "admin"})
            )
            teams_svc.create_team(db=db, principal=root, name="alpha", quotas=[teams_svc.Quota("cpu", 4)])
            db.flush()
            doc = {
                **spec(team="alpha", name="lr"),
                "sweep": {"random": SPACE, "search": "tpe", "seed": 3, "count": 4, "initial": 1},
            }
            sweep_id = submit_sweep(db=db, principal=root, document=doc).sweep.id
            (first,) = jobs_of(db, sweep_id)
            end(first, JobState.SUCCEEDED, 1.5)
            db.commit()

        cycle_db = factory()
        (proposed,) = propose_due(db=cycle_db)  # the sweep's row locked until the cycle commits
        cancelled = threading.Event()

        def cancel() -> None:
            with factory() as api_db:
                cancel_all(db=api_db, principal=root, sweep_id=sweep_id)
                api_db.commit()
            cancelled.set()

        thread = threading.Thread(target=cancel)
        thread.start()
        assert not cancelled.wait(1.0)  # waits for the cycle
        cycle_db.commit()
        cycle_db.close()
        thread.join(timeout=30)
        assert cancelled.is_set()
        with factory() as db:
            states = {j.id: j.state for j in jobs_of(db, sweep_id)}
            assert states == {first.id: "SUCCEEDED", proposed: "CANCELLED"}, states
            assert propose_due(db=db) == []
        engine.dispose()
