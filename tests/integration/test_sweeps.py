"""Sweeps on PostgreSQL: one submission becomes a job per point of its grid, the scheduler runs at most
max_concurrent of them at once (SweepLimit), and the sweep reads best first."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Job
from core.settings import Settings
from tests.integration.test_scheduler_loop import cycle, dispatched  # noqa: F401  (fixture)
from tests.support.api import World, spec
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration


def sweep_doc(**section: object) -> dict[str, object]:
    return {**spec(team="alpha", name="lr"), "sweep": section}


def test_a_grid_becomes_one_job_per_combination(client: TestClient, world: World) -> None:
    doc = sweep_doc(grid={"lr": [0.001, 0.003], "steps": [10, 20]}, max_concurrent=2)
    r = client.post(
        "/v1/sweeps", content=yaml.safe_dump(doc), headers={**world.h("member"), "Content-Type": "application/yaml"}
    )
    assert r.status_code == 201, r.text
    sweep = r.json()
    assert r.headers["location"] == f"/v1/sweeps/{sweep['id']}"
    assert sweep["keys"] == ["lr", "steps"] and sweep["max_concurrent"] == 2
    assert sorted(j["name"] for j in sweep["jobs"]) == ["lr-0", "lr-1", "lr-2", "lr-3"]
    assert sorted((j["settings"]["lr"], j["settings"]["steps"]) for j in sweep["jobs"]) == [
        (0.001, 10),
        (0.001, 20),
        (0.003, 10),
        (0.003, 20),
    ]
    one = client.get(f"/v1/jobs/{sweep['jobs'][0]['id']}", headers=world.h("member")).json()
    assert one["spec"]["recipe"]["hyperparameters"]["lr"] == sweep["jobs"][0]["settings"]["lr"]
    listed = client.get("/v1/sweeps", headers=world.h("viewer")).json()
    assert [s["id"] for s in listed["items"]] == [sweep["id"]] and listed["next_cursor"] is None
    assert client.get(f"/v1/sweeps/{sweep['id']}", headers=world.h("beta-member")).status_code == 404
    # The job list takes the sweep as a filter, with the others; another team's member sees none of its jobs.
    jobs = client.get("/v1/jobs", params={"sweep": sweep["id"]}, headers=world.h("viewer")).json()["items"]
    assert sorted(j["id"] for j in jobs) == sorted(j["id"] for j in sweep["jobs"])  # the world's own job left out
    some = client.get("/v1/jobs", params={"sweep": sweep["id"], "name": "lr-1"}, headers=world.h("viewer")).json()
    assert [j["name"] for j in some["items"]] == ["lr-1"]
    assert client.get("/v1/jobs", params={"sweep": sweep["id"]}, headers=world.h("beta-member")).json()["items"] == []
    assert client.get("/v1/jobs", params={"sweep": 0}, headers=world.h("viewer")).status_code == 422


def test_bad_sweeps_are_refused_with_the_field(client: TestClient, world: World) -> None:
    h = world.h("member")
    for doc, loc in (
        (sweep_doc(), "sweep"),
        (sweep_doc(grid={"lr": [0.1]}, list=[{"lr": 0.2}]), "sweep"),
        (sweep_doc(grid={"lr": []}), "sweep.grid.lr"),
        (sweep_doc(grid={"lrr": [0.1]}), "recipe.hyperparameters.lrr"),
        (sweep_doc(grid={"lr": [0.1]}, max_concurent=2), "sweep.max_concurent"),
        (sweep_doc(grid={"a": list(range(20)), "b": list(range(20))}), "sweep.grid"),
    ):
        r = client.post("/v1/sweeps", json=doc, headers=h)
        assert r.status_code == 422, (doc, r.text)
        assert r.json()["errors"][0]["loc"] == loc, r.json()


@pytest.mark.usefixtures("dispatched")
def test_at_most_max_concurrent_run_and_the_best_comes_first(db: Session, client: TestClient, world: World) -> None:
    HostAgent(
        name="sweep-host",
        inventory=NoGpus(),
        cpu_slots=4,
        address="127.0.0.1",
        settings=Settings(heartbeat_interval_s=1),
    ).register(db)
    db.commit()
    r = client.post(
        "/v1/sweeps",
        json=sweep_doc(list=[{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}], max_concurrent=2),
        headers=world.h("member"),
    )
    assert r.status_code == 201, r.text
    ids = [j["id"] for j in r.json()["jobs"]]
    cycle(db, utcnow() + timedelta(seconds=1))
    jobs = {i: db.get(Job, i) for i in ids}
    assert sorted(j.state for j in jobs.values() if j is not None) == ["ADMITTED", "ADMITTED", "QUEUED"]
    waiting = next(j for j in jobs.values() if j is not None and j.state == "QUEUED")
    assert waiting.pending_reason == "SweepLimit", waiting.pending_message

    for job, (state, loss) in zip(
        jobs.values(), (("SUCCEEDED", 2.5), ("SUCCEEDED", 1.9), ("QUEUED", None)), strict=True
    ):
        assert job is not None
        job.state, job.last_loss = state, loss
    db.flush()
    shown = client.get(f"/v1/sweeps/{r.json()['id']}", headers=world.h("member")).json()
    assert [(j["state"], j["last_loss"]) for j in shown["jobs"]] == [
        ("SUCCEEDED", 1.9),
        ("SUCCEEDED", 2.5),
        ("QUEUED", None),
    ]


def test_random_draws_held_and_ranked_by_their_objective(db: Session, client: TestClient, world: World) -> None:
    doc = sweep_doc(
        random={"lr": {"log_uniform": [1e-4, 1e-2]}, "steps": [10, 20]},
        count=4,
        objective={"metric": "accuracy", "goal": "maximize"},
    )
    r = client.post("/v1/sweeps", json=doc, params={"hold": "true"}, headers=world.h("member"))
    assert r.status_code == 201, r.text
    sweep = r.json()
    seed = sweep["parameters"]["seed"]  # drawn and stored: the same section with it draws the same jobs
    assert isinstance(seed, int) and sweep["keys"] == ["lr", "steps"] and len(sweep["jobs"]) == 4
    assert sweep["objective"]["metric"] == "accuracy" and sweep["objective"]["goal"] == "maximize"
    assert all(1e-4 <= j["settings"]["lr"] <= 1e-2 and j["settings"]["steps"] in (10, 20) for j in sweep["jobs"])
    again = client.post(
        "/v1/sweeps",
        json={**doc, "sweep": {**doc["sweep"], "seed": seed}},  # type: ignore[dict-item]
        headers=world.h("member"),
    ).json()
    assert [j["settings"] for j in again["jobs"]] == [j["settings"] for j in sweep["jobs"]]
    held = client.get("/v1/jobs", params={"sweep": sweep["id"], "held": "true"}, headers=world.h("member")).json()
    assert sorted(j["id"] for j in held["items"]) == sorted(j["id"] for j in sweep["jobs"])
    assert (
        client.get("/v1/jobs", params={"sweep": again["id"], "held": "true"}, headers=world.h("member")).json()["items"]
        == []
    )

    ids = sorted(j["id"] for j in sweep["jobs"])
    for i, (state, accuracy) in zip(
        ids, (("SUCCEEDED", 0.91), ("SUCCEEDED", 0.97), ("FAILED", 0.99), ("QUEUED", None)), strict=True
    ):
        job = db.get(Job, i)
        assert job is not None
        job.state, job.last_loss = state, 1.0
        job.eval_metrics = {"step": 10, "metrics": {"accuracy": accuracy}} if accuracy is not None else None
    db.flush()
    shown = client.get(f"/v1/sweeps/{sweep['id']}", headers=world.h("member")).json()
    assert [j["id"] for j in shown["jobs"]] == [ids[1], ids[0], ids[2], ids[3]]
    assert shown["jobs"][0]["metrics"] == {"accuracy": 0.97}
    bad = client.post(
        "/v1/sweeps", json=sweep_doc(random={"lr": {"uniform": [1, 0]}}, count=2), headers=world.h("member")
    )
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == "sweep.random.lr.uniform", bad.text


def test_a_sweeps_curves_are_each_jobs_objective_over_its_steps(db: Session, client: TestClient, world: World) -> None:
    from core.models import JobMetric
    from core.transitions import record_event

    doc = sweep_doc(list=[{"lr": 0.1}, {"lr": 0.01}], objective={"metric": "accuracy", "goal": "maximize"})
    sweep = client.post("/v1/sweeps", json=doc, headers=world.h("member")).json()
    first, second = (db.get(Job, j["id"]) for j in sorted(sweep["jobs"], key=lambda j: j["id"]))
    assert first is not None and second is not None
    for job, step, accuracy in (
        (first, 10, 0.5),
        (first, 20, 0.7),
        (second, 10, 0.6),
        (second, 20, 0.9),
        (first, 20, 0.75),
    ):  # a step again after a resume: the latest counts
        record_event(db, "EVALUATION", job=job, data={"step": step, "metrics": {"accuracy": accuracy, "f1": 0.1}})
        job.eval_metrics = {"step": step, "metrics": {"accuracy": accuracy}}
    db.flush()
    shown = client.get(f"/v1/sweeps/{sweep['id']}/curves", headers=world.h("viewer")).json()
    assert (shown["metric"], shown["goal"]) == ("accuracy", "maximize")
    assert [(c["job_id"], c["points"]) for c in shown["curves"]] == [
        (second.id, [[10, 0.6], [20, 0.9]]),
        (first.id, [[10, 0.5], [20, 0.75]]),
    ]  # best first
    assert client.get(f"/v1/sweeps/{sweep['id']}/curves", headers=world.h("beta-member")).status_code == 404

    doc = {**sweep_doc(list=[{"lr": 0.1}]), "steps": 1000}
    by_loss = client.post("/v1/sweeps", json=doc, headers=world.h("member")).json()
    job = db.get(Job, by_loss["jobs"][0]["id"])
    assert job is not None
    db.add_all(JobMetric(job_id=job.id, step=s, loss=10.0 - s / 100) for s in range(1, 1000))
    job.last_step, job.last_loss = 999, 0.01
    db.flush()
    curve = client.get(f"/v1/sweeps/{by_loss['id']}/curves", headers=world.h("member")).json()["curves"][0]
    steps = [s for s, _ in curve["points"]]
    assert len(steps) <= 201 and steps[0] == 5 and steps[-1] == 999 and steps == sorted(steps)  # every 5th, the last
    assert curve["points"][-1] == [999, 0.01]


def test_a_sweep_is_held_released_and_cancelled_as_one(db: Session, client: TestClient, world: World) -> None:
    sweep = client.post(
        "/v1/sweeps", json=sweep_doc(list=[{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}]), headers=world.h("member")
    ).json()
    ids = sorted(j["id"] for j in sweep["jobs"])
    path = f"/v1/sweeps/{sweep['id']}"
    assert client.post(f"{path}/hold", headers=world.h("viewer")).status_code == 403  # nothing changed
    assert client.post(f"{path}/cancel", headers=world.h("beta-member")).status_code == 404
    assert not any(db.get(Job, i).held_at or db.get(Job, i).cancel_requested for i in ids)  # type: ignore[union-attr]
    done = db.get(Job, ids[0])
    assert done is not None
    done.state = "SUCCEEDED"  # an ended job is left as it is
    db.flush()

    held = client.post(f"{path}/hold", json={"reason": "wait for the data"}, headers=world.h("member"))
    assert held.status_code == 200, held.text
    by_id = {j["id"]: j for j in held.json()["jobs"]}
    assert [by_id[i]["pending_reason"] for i in ids] == [None, "Held", "Held"]
    assert client.post(f"{path}/hold", headers=world.h("member")).status_code == 200  # none left: a no-op
    released = {j["id"]: j for j in client.post(f"{path}/release", headers=world.h("member")).json()["jobs"]}
    assert [released[i]["pending_reason"] for i in ids[1:]] != ["Held", "Held"]
    assert all(db.get(Job, i).held_at is None for i in ids)  # type: ignore[union-attr]

    cancelled = client.post(f"{path}/cancel", json={"reason": "a bug in the data"}, headers=world.h("member"))
    assert cancelled.status_code == 200, cancelled.text
    assert sorted(j["state"] for j in cancelled.json()["jobs"]) == ["CANCELLED", "CANCELLED", "SUCCEEDED"]
    assert client.post(f"{path}/cancel", headers=world.h("member")).status_code == 200  # nothing left to cancel
