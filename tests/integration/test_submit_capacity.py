"""Requests no host can ever run are refused at submit (problem+json 422) with what the cluster has and the largest
request it could hold; an operator may let them wait for hosts that will join; before any host has registered,
every job is accepted. The answer and the SUBMITTED event say when a job waits for capacity not yet joined."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Event
from core.repositories.teams import submission_context
from core.settings import Settings
from tests.support.api import World, spec
from tests.support.nvml_replay import NVMLReplay
from workers.host_agent import HostAgent

pytestmark = pytest.mark.integration

GIB = 2**30
BEYOND = "(an operator may accept such jobs to wait for hosts that will join: KILN_ACCEPT_BEYOND_CAPACITY)"


def join(db: Session, tmp_path: Path, name: str, *, gpus: int = 0, model: str = "NVIDIA H200", slots: int = 0) -> None:
    """A host registers as its agent does: ``gpus`` GPUs of ``model`` (NVML's name), ``slots`` CPU slots."""
    found = [
        {
            "uuid": f"GPU-{name}-{i}",
            "index": i,
            "model": model,
            "memory_bytes": 141 * GIB,
            "mig_mode": False,
            "pcie_gen": 5,
            "nvlink_peers": [],
        }
        for i in range(gpus)
    ]
    recording = tmp_path / f"{name}.json"
    recording.write_text(json.dumps({"gpus": found, "samples": []}))
    settings = Settings(heartbeat_interval_s=1)
    HostAgent(name=name, inventory=NVMLReplay(recording), cpu_slots=slots, address=None, settings=settings).register(db)
    db.commit()  # a savepoint under the test's transaction: a refused request's rollback keeps the host


def gpu_job(**resources: Any) -> dict[str, Any]:
    return spec(resources={"gpu_type": "H200", **resources})


def refused(client: TestClient, world: World, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/jobs", json=body, headers=world.h("member"))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    (err,) = r.json()["errors"]
    return err


@pytest.fixture
def two_h200_hosts(db: Session, tmp_path: Path, world: World) -> None:
    """Joined after ``world`` submitted its CPU jobs, which GPU hosts without CPU slots could not hold."""
    join(db, tmp_path, "h200-a", gpus=8)
    join(db, tmp_path, "h200-b", gpus=8)


@pytest.mark.usefixtures("two_h200_hosts")
def test_more_gpus_than_the_cluster_has_is_refused_with_the_largest_it_could_hold(
    client: TestClient, world: World
) -> None:
    err = refused(client, world, gpu_job(gpus=64))
    assert (err["loc"], err["type"]) == ("resources.gpus", "unschedulable")
    assert err["msg"] == (
        "requests 64 H200 GPUs; the whole cluster has 16 (H200: 8 GPUs a host, 2 hosts): ask for at most 16 " + BEYOND
    )
    assert client.post("/v1/jobs", json=gpu_job(gpus=16), headers=world.h("member")).status_code == 201


@pytest.mark.usefixtures("two_h200_hosts")
def test_a_gpu_type_no_host_has_is_refused_with_the_types_the_cluster_has(client: TestClient, world: World) -> None:
    err = refused(client, world, gpu_job(gpu_type="H300", gpus=8))
    assert (err["loc"], err["type"]) == ("resources.gpu_type", "unknown_gpu_type")
    assert err["msg"] == (
        "no host has GPU type H300 (the cluster has H200: 8 GPUs a host, 2 hosts); did you mean 'H200'? " + BEYOND
    )


@pytest.mark.usefixtures("two_h200_hosts")
def test_a_gang_more_hosts_than_the_cluster_has_is_refused(client: TestClient, world: World) -> None:
    err = refused(client, world, gpu_job(gpus=24, gpus_per_node=8))
    assert (err["loc"], err["type"]) == ("resources.gpus_per_node", "unschedulable")
    assert err["msg"].startswith("requests 24 H200 GPUs, 8 a host; the whole cluster has 2 hosts with 8 (")
    assert "ask for at most 16, 8 a host" in err["msg"]


def test_more_cpu_slots_than_the_embedded_default_has_are_refused_and_gpus_too(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    """``kiln up`` registers one CPU host: 16 CPU slots, or any GPU, can never run there."""
    join(db, tmp_path, "laptop", slots=2)
    err = refused(client, world, spec(resources={"gpus": 0, "cpu_slots": 16}))
    assert (err["loc"], err["type"]) == ("resources.cpu_slots", "unschedulable")
    assert err["msg"] == (
        "requests 16 CPU slots; the whole cluster has 2 (2 CPU slots a host, 1 host): ask for at most 2 " + BEYOND
    )
    err = refused(client, world, gpu_job(gpus=1))
    assert err["msg"].startswith("no host has GPU type H200 (the cluster has 2 CPU slots a host, 1 host): only CPU")
    body = spec(resources={"gpus": 0, "cpu_slots": 2})
    assert client.post("/v1/jobs", json=body, headers=world.h("member")).status_code == 201


def submitted_event(db: Session, job_id: int) -> Event:
    return db.scalars(select(Event).where(Event.job_id == job_id, Event.type == "SUBMITTED")).one()


@pytest.mark.usefixtures("two_h200_hosts")
def test_an_operator_may_accept_jobs_beyond_capacity_and_the_answer_says_they_wait_for_it(
    db: Session, client: TestClient, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.app.state.settings, "accept_beyond_capacity", True)  # what the API gives the service
    r = client.post("/v1/jobs", json=gpu_job(gpus=64), headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "QUEUED" and job["pending_reason"] is None  # the scheduler's to give, at its next cycle
    assert job["pending_message"] == (
        "waits for capacity not yet joined: requests 64 H200 GPUs; the whole cluster has 16 (H200: 8 GPUs a host, "
        "2 hosts): ask for at most 16"
    )
    event = submitted_event(db, job["id"])
    assert "; waits for capacity not yet joined: requests 64 H200 GPUs" in event.message
    assert event.data["waits_for_capacity"].startswith("requests 64 H200 GPUs")


def test_before_any_host_has_registered_every_job_is_accepted_and_waits_for_hosts(
    db: Session, client: TestClient, world: World
) -> None:
    """A fresh deployment whose workers have not joined has nothing to compare with: refusing would refuse all."""
    r = client.post("/v1/jobs", json=gpu_job(gpu_type="H300", gpus=64), headers=world.h("member"))
    assert r.status_code == 201, r.text
    assert r.json()["pending_message"] == "waits for capacity not yet joined: no host has registered yet"
    assert submitted_event(db, r.json()["id"]).data["waits_for_capacity"] == "no host has registered yet"


def test_a_gpu_family_name_matches_any_of_its_variants_and_a_variant_only_itself(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    """An H100 host registers as H100-80GB (NVML's "NVIDIA H100 80GB HBM3"); ``gpu_type: H100`` was refused with
    "did you mean 'H100-80GB'?"."""
    join(db, tmp_path, "h100", gpus=8, model="NVIDIA H100 80GB HBM3")
    ctx = submission_context(db, team="alpha", qos=None, default_qos="silver", terms=(), gpu_type="H100")
    assert (ctx.type_gpus, ctx.type_max_memory) == (8, 141 * GIB)  # the submission's one read counts the family
    ok = client.post("/v1/jobs", json=gpu_job(gpu_type="H100", gpus=8), headers=world.h("member"))
    assert ok.status_code == 201, ok.text
    assert client.post("/v1/jobs", json=gpu_job(gpu_type="h100-80gb"), headers=world.h("member")).status_code == 201
    err = refused(client, world, gpu_job(gpu_type="H100", gpus=16))
    assert err["msg"] == (
        "requests 16 H100 GPUs; the whole cluster has 8 (H100-80GB: 8 GPUs a host, 1 host): ask for at most 8 " + BEYOND
    )
    err = refused(client, world, gpu_job(gpu_type="H100-PCIE"))
    assert (err["loc"], err["type"]) == ("resources.gpu_type", "unknown_gpu_type")
