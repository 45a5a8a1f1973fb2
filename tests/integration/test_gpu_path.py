"""The GPU path as a new user meets it, on PostgreSQL, with the NVML replay double standing in for the GPU.

What failed on the H200 host: NVML registers ``NVIDIA H200`` while the shipped spec asks for ``H200`` (placement
found none), the embedded default's ``default`` team had no GPU quota, and a class's memory cap below the job's
predicted peak was discovered only by an OOM.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.gpu_types import canonical
from core.models import GPU, Job, QosClass, Team
from core.services.bootstrap import give_default_team_gpus
from core.settings import Settings
from core.spec import parse_spec_text
from tests.integration.test_scheduler_loop import cycle, dispatched  # noqa: F401  (fixture)
from tests.support.api import World
from tests.support.nvml_replay import NVMLReplay
from workers.host_agent import HostAgent

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2-124m-h200.yaml"
GIB = 2**30


@pytest.mark.parametrize(
    ("nvml", "expected"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIE"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIE"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA L40S", "L40S"),
        ("h100-80gb", "H100-80GB"),
    ],
)
def test_one_vocabulary_for_gpu_types(nvml: str, expected: str) -> None:
    assert canonical(nvml) == expected
    assert canonical(expected) == expected  # a type a person writes and one made from NVML's name meet


def register(db: Session, tmp_path: Path, name: str, model: str, *, count: int = 1, memory: int = 141 * GIB) -> None:
    gpus = [
        {
            "uuid": f"GPU-{name}-{i}",
            "index": i,
            "model": model,
            "memory_bytes": memory,
            "mig_mode": False,
            "pcie_gen": 5,
            "nvlink_peers": [],
        }
        for i in range(count)
    ]
    recording = tmp_path / f"{name}.json"
    recording.write_text(json.dumps({"gpus": gpus, "samples": []}))
    agent = HostAgent(
        name=name, inventory=NVMLReplay(recording), cpu_slots=0, address=None, settings=Settings(heartbeat_interval_s=1)
    )
    agent.register(db)
    db.commit()  # a savepoint under the test's transaction: a refused request's rollback keeps the host


def example(**changes: Any) -> dict[str, Any]:
    spec = parse_spec_text(EXAMPLE.read_text()).model_dump(mode="json", exclude_none=True)
    for path, value in changes.items():
        node = spec
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return spec


def grant_gold(client: TestClient, world: World) -> None:
    """The shipped example asks for gold, which a team may use only when an admin grants it."""
    r = client.patch(
        "/v1/teams/alpha", json={"qos_classes": ["gold", "silver", "bronze", "best-effort"]}, headers=world.h("admin")
    )
    assert r.status_code == 200, r.text


@pytest.mark.usefixtures("dispatched")
def test_the_shipped_h200_example_is_placed_on_a_host_nvml_names_nvidia_h200(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    """Registration with NVML's own name, the default team given the host's GPUs as ``kiln up`` does, the shipped
    example submitted as it is, one scheduling cycle: admitted on the GPU."""
    register(db, tmp_path, "h200-host", "NVIDIA H200")
    default = db.scalars(select(Team).where(Team.name == "default")).one()
    assert give_default_team_gpus(db=db, gpus_by_type={"H200": 1}) == ["*=1"]  # every type: typed jobs and untyped
    assert give_default_team_gpus(db=db, gpus_by_type={"H200": 1}) == []  # an existing quota is never changed
    assert {q.gpu_type: q.nominal for q in default.quotas} == {"cpu": 4, "*": 1}

    r = client.post("/v1/jobs", json=example(), headers=world.h("admin"))
    assert r.status_code == 201, r.text
    job = db.get(Job, r.json()["id"])
    assert job is not None and job.gpu_type == "H200" and job.spec["resources"]["gpu_type"] == "H200"
    assert job.predicted_memory_bytes is not None and 8 * GIB < job.predicted_memory_bytes < 16 * GIB

    cycle(db, utcnow() + timedelta(seconds=1))
    db.refresh(job)
    assert job.state == "ADMITTED", (job.pending_reason, job.pending_message)
    assert job.attempts[0].placement[0]["host"] == "h200-host"


def test_a_type_written_as_nvml_names_it_is_stored_as_the_type(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    register(db, tmp_path, "h100-host", "NVIDIA H100 80GB HBM3")
    grant_gold(client, world)
    r = client.post(
        "/v1/jobs",
        json=example(**{"resources.gpu_type": "NVIDIA H100 80GB HBM3", "team": "alpha"}),
        headers=world.h("member"),
    )
    assert r.status_code == 201, r.text
    assert r.json()["gpu_type"] == "H100-80GB"

    r = client.patch(
        "/v1/teams/alpha",
        json={"quotas": [{"gpu_type": "NVIDIA H100 80GB HBM3", "nominal": 2}]},
        headers=world.h("admin"),
    )
    assert r.status_code == 200, r.text
    assert r.json()["quotas"][0]["gpu_type"] == "H100-80GB"


def test_a_type_no_host_has_is_refused_with_the_types_the_cluster_has(
    db: Session, tmp_path: Path, client: TestClient, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before any GPU host registers there is nothing to compare with: accepted (it waits for such a host).
    grant_gold(client, world)
    r = client.post(
        "/v1/jobs",
        json=example(**{"resources.gpu_type": "H20O", "team": "alpha", "name": "early"}),
        headers=world.h("member"),
    )
    assert r.status_code == 201, r.text

    register(db, tmp_path, "h200-host", "NVIDIA H200")
    r = client.post(
        "/v1/jobs", json=example(**{"resources.gpu_type": "H20O", "team": "alpha"}), headers=world.h("member")
    )
    assert r.status_code == 422, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    err = problem["errors"][0]
    assert err["loc"] == "resources.gpu_type" and "did you mean 'H200'" in err["msg"] and "H200" in err["msg"]

    r = client.patch("/v1/teams/alpha", json={"quotas": [{"gpu_type": "B300", "nominal": 2}]}, headers=world.h("admin"))
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "quotas.0.gpu_type"

    # Hosts that will join later are declared by the operator.
    monkeypatch.setattr(client.app.state.settings, "gpu_types", ["B300"])  # what the API gives the service
    r = client.patch("/v1/teams/alpha", json={"quotas": [{"gpu_type": "b300", "nominal": 2}]}, headers=world.h("admin"))
    assert r.status_code == 200, r.text


def test_a_job_over_its_class_memory_cap_is_refused_naming_the_classes_that_fit(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    register(db, tmp_path, "h200-host", "NVIDIA H200")
    # The shipped example as it is fits the seeded gold class (a whole GPU's memory).
    assert client.post("/v1/jobs", json=example(name="fits"), headers=world.h("admin")).status_code == 201

    gold = db.scalars(select(QosClass).where(QosClass.name == "gold")).one()
    gold.gpu_memory_cap_bytes = 8 * 10**9  # an admin caps gold at 8 GB, as the first seed did
    db.flush()
    r = client.post("/v1/jobs", json=example(name="capped"), headers=world.h("admin"))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["loc"] == "sla.qos" and err["type"] == "memory_fit"
    assert "exceeds the gold class's memory cap of 7.5 GiB" in err["msg"]
    assert "classes whose cap fits: silver, bronze, best-effort" in err["msg"]


def unblock_after_memory_shrank(
    db: Session, tmp_path: Path, client: TestClient, world: World, shrink: Callable[[], None]
) -> list[str]:
    """The shipped example submitted to an H200 host, then ``shrink`` (after the submit: the scheduler finds it);
    the job must wait MemoryFit. Returns what ``why`` says would unblock it."""
    register(db, tmp_path, "h200-host", "NVIDIA H200")
    give_default_team_gpus(db=db, gpus_by_type={"H200": 1})
    r = client.post("/v1/jobs", json=example(name="shrunk"), headers=world.h("admin"))
    assert r.status_code == 201, r.text
    shrink()
    db.flush()
    cycle(db, utcnow() + timedelta(seconds=1))
    job = db.get(Job, r.json()["id"])
    assert job is not None and job.pending_reason == "MemoryFit", (job.state, job.pending_message)
    return list(client.get(f"/v1/jobs/{job.id}/why", headers=world.h("admin")).json()["unblock"])


@pytest.mark.usefixtures("dispatched")
def test_a_queued_job_whose_class_cap_shrank_waits_memory_fit_and_why_names_other_classes(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    def cap_gold() -> None:
        db.scalars(select(QosClass).where(QosClass.name == "gold")).one().gpu_memory_cap_bytes = 8 * 10**9

    unblock = unblock_after_memory_shrank(db, tmp_path, client, world, cap_gold)
    assert unblock[-1] == "a class whose memory cap fits: silver, bronze, best-effort (sla.qos)"


@pytest.mark.usefixtures("dispatched")
def test_a_job_whose_gpus_became_too_small_waits_memory_fit_and_why_suggests_no_other_class(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    """Its own class's cap fits: another class would not help, so why names none (the GPUs are what is short)."""

    def smaller_gpus() -> None:  # the host came back with smaller GPUs of the same type
        for gpu in db.scalars(select(GPU)):
            gpu.memory_bytes = 8 * GIB

    unblock = unblock_after_memory_shrank(db, tmp_path, client, world, smaller_gpus)
    assert unblock and not any("class" in hint for hint in unblock), unblock


def test_a_job_larger_than_every_gpu_of_its_type_is_refused(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    register(db, tmp_path, "small-gpu", "NVIDIA GeForce RTX 3070", memory=8 * GIB)
    spec = example(**{"resources.gpu_type": "RTX-3070", "name": "too-big"})
    r = client.post("/v1/jobs", json=spec, headers=world.h("admin"))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["loc"] == "resources" and "the largest RTX-3070 GPU has 8.0 GiB" in err["msg"]
    spec["recipe"]["hyperparameters"]["batch_size"] = 8  # a quarter of the activations: it fits
    assert client.post("/v1/jobs", json=spec, headers=world.h("admin")).status_code == 201


@pytest.mark.usefixtures("dispatched")
def test_more_gpus_than_the_cluster_has_is_refused_or_waits_unschedulable_with_what_would_unblock_it(
    db: Session, tmp_path: Path, client: TestClient, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(db, tmp_path, "h200-host", "NVIDIA H200", count=2)
    register(db, tmp_path, "h100-host", "NVIDIA H100 80GB HBM3", count=8)
    grant_gold(client, world)
    eight = example(**{"resources.gpus": 8, "team": "alpha", "name": "eight"})
    r = client.post("/v1/jobs", json=eight, headers=world.h("member"))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["loc"] == "resources.gpus" and err["type"] == "unschedulable"
    assert err["msg"].startswith(
        "requests 8 H200 GPUs; the whole cluster has 2 (H100-80GB: 8 GPUs a host, 1 host; "
        "H200: 2 GPUs a host, 1 host): ask for at most 2"
    ), err["msg"]

    # The operator declares that H200 hosts will join: accepted, and it waits as Unschedulable until they do.
    monkeypatch.setattr(client.app.state.settings, "gpu_types", ["H200"])  # what the API gives the service
    r = client.post("/v1/jobs", json=eight, headers=world.h("member"))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    cycle(db, utcnow() + timedelta(seconds=1))
    job = db.get(Job, job_id)
    assert job is not None and job.state == "QUEUED" and job.pending_reason == "Unschedulable", job.pending_message
    assert "the whole cluster has 2" in (job.pending_message or "")

    listed = client.get("/v1/jobs", params={"team": "alpha", "state": "QUEUED"}, headers=world.h("member")).json()
    assert {j["id"]: j["pending_reason"] for j in listed["items"]}[job_id] == "Unschedulable"
    why = client.get(f"/v1/jobs/{job_id}/why", headers=world.h("member")).json()
    assert why["pending_reason"] == "Unschedulable"
    assert why["unblock"] == [
        "fewer GPUs: the whole cluster has 2 H200 GPUs",
        "another GPU type: H100-80GB (8 in the cluster)",
    ]
