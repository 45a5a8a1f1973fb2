"""Fractional GPUs from submit to placement, on PostgreSQL: the host's MPS daemon (a stand-in for the binary:
no GPU here) reported by its agent, shares checked at submit, packed onto one GPU by a real scheduling cycle."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Event, Host, Job
from core.services.bootstrap import give_default_team_gpus
from core.settings import get_settings
from tests.integration.test_gpu_path import example, register
from tests.integration.test_scheduler_loop import cycle, dispatched  # noqa: F401  (fixture)
from tests.support.api import World
from tests.support.nvml_replay import NVMLReplay
from workers import mps
from workers.host_agent import HostAgent

pytestmark = pytest.mark.integration

STANDIN = str(Path(__file__).resolve().parents[1] / "support" / "mps_standin.py")
HALF = {"memory_gb": 40, "sm_percent": 50}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[mps.MpsDaemon]:
    d = mps.configure("auto", STANDIN, tmp_path / "mps")
    assert d is not None and d.state == "running"
    yield d
    d.stop()
    mps.DAEMON = None


def agent_of(tmp_path: Path, name: str) -> HostAgent:
    return HostAgent(
        name=name,
        inventory=NVMLReplay(tmp_path / f"{name}.json"),
        cpu_slots=0,
        address=None,
        settings=get_settings().model_copy(update={"heartbeat_interval_s": 1}),
    )


@pytest.mark.usefixtures("dispatched")
def test_small_jobs_share_one_gpu_through_the_hosts_mps_daemon(
    db: Session, tmp_path: Path, client: TestClient, world: World, daemon: mps.MpsDaemon
) -> None:
    register(db, tmp_path, "h200-host", "NVIDIA H200", count=2)
    agent = agent_of(tmp_path, "h200-host")
    agent.heartbeat(db)
    host = db.scalars(select(Host).where(Host.name == "h200-host")).one()
    assert host.mps == "running"
    give_default_team_gpus(db=db, gpus_by_type={"H200": 2})

    def submit(name: str, **changes: object) -> int:
        r = client.post("/v1/jobs", json=example(name=name, **changes), headers=world.h("admin"))
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    ids = [submit("small-0", **{"resources.gpu_share": HALF}), submit("small-1", **{"resources.gpu_share": HALF})]
    whole = submit("whole")
    cycle(db, utcnow() + timedelta(seconds=1))
    jobs = {j: db.get(Job, j) for j in [*ids, whole]}
    placed = {j: job.attempts[0].placement[0] for j, job in jobs.items() if job is not None and job.attempts}
    assert set(placed) == {*ids, whole}, {j: job.pending_message for j, job in jobs.items() if job is not None}
    assert placed[ids[0]]["gpus"] == placed[ids[1]]["gpus"] != placed[whole]["gpus"]
    assert placed[ids[0]]["share"] == {"memory_bytes": 40 * 2**30, "sm_percent": 50, "guaranteed": True}
    assert "share" not in placed[whole]

    third = submit("small-2", **{"resources.gpu_share": HALF})  # 150% of guaranteed SMs: no room left
    cycle(db, utcnow() + timedelta(seconds=2))
    job = db.get(Job, third)
    assert job is not None and job.state == "QUEUED"
    assert "no GPU has room for a share of 40.0 GiB and 50% of the SMs (guaranteed)" in (job.pending_message or "")
    admitted = db.scalars(select(Event).where(Event.job_id == ids[0], Event.type == "ADMITTED")).one()
    assert f"sharing GPU {placed[ids[0]]['gpus'][0]}: 40.0 GiB and 50% of the SMs (guaranteed)" in admitted.message


@pytest.mark.usefixtures("dispatched")
def test_untyped_jobs_run_on_the_gpus_kiln_up_gave_the_default_team(
    db: Session, tmp_path: Path, client: TestClient, world: World, daemon: mps.MpsDaemon
) -> None:
    """Regression (bench/mps_bench.py on the H200, its second run): ``kiln up`` gave the default team a quota
    ``H200=1``; a job that names no GPU type (every share in the bench) draws on ``*`` and waited for ever on "team
    quota *: 0 in use of nominal 0"."""
    register(db, tmp_path, "h200-host", "NVIDIA H200", count=2)
    agent_of(tmp_path, "h200-host").heartbeat(db)
    assert give_default_team_gpus(db=db, gpus_by_type={"H200": 2}) == ["*=2"]
    ids = []
    for name, changes in (("share", {"resources.gpu_share": HALF}), ("whole", {})):
        spec = example(name=name, **changes)
        del spec["resources"]["gpu_type"]
        r = client.post("/v1/jobs", json=spec, headers=world.h("admin"))
        assert r.status_code == 201, r.text
        ids.append(int(r.json()["id"]))
    cycle(db, utcnow() + timedelta(seconds=1))
    for job_id in ids:
        job = db.get(Job, job_id)
        assert job is not None and job.state == "ADMITTED", (job.pending_reason, job.pending_message)


def test_an_admins_gpu_quota_is_never_widened(db: Session, client: TestClient, world: World) -> None:
    r = client.patch(
        "/v1/teams/default",
        json={"quotas": [{"gpu_type": "cpu", "nominal": 4}, {"gpu_type": "H200", "nominal": 0}]},
        headers=world.h("admin"),
    )
    assert r.status_code == 200, r.text
    assert give_default_team_gpus(db=db, gpus_by_type={"H200": 2}) == []


@pytest.mark.usefixtures("dispatched")
def test_untyped_jobs_draw_on_a_typed_only_quota_and_their_gpus_count_against_it(
    db: Session, tmp_path: Path, client: TestClient, world: World
) -> None:
    """An admin gave the team only ``H200=1``: a job that names no GPU type runs on the H200 (flavor fungibility)
    and, admitted, holds that quota, so the next one waits for it instead of running over it."""
    register(db, tmp_path, "h200-host", "NVIDIA H200", count=2)
    r = client.patch(
        "/v1/teams/default",
        json={"quotas": [{"gpu_type": "cpu", "nominal": 4}, {"gpu_type": "H200", "nominal": 1}]},
        headers=world.h("admin"),
    )
    assert r.status_code == 200, r.text
    ids = []
    for name in ("first", "second"):
        spec = example(name=name)
        del spec["resources"]["gpu_type"]
        r = client.post("/v1/jobs", json=spec, headers=world.h("admin"))
        assert r.status_code == 201, r.text
        ids.append(int(r.json()["id"]))
        cycle(db, utcnow() + timedelta(seconds=len(ids)))
    first, second = (db.get(Job, i) for i in ids)
    assert first is not None and first.state == "ADMITTED", (first.pending_reason, first.pending_message)
    assert second is not None and second.state == "QUEUED" and second.pending_reason == "Quota", second.state
    assert "none of its GPU quotas has room for it (H200: 1 in use of 1)" in (second.pending_message or "")


def test_shares_go_only_to_hosts_whose_mps_daemon_runs(
    db: Session, tmp_path: Path, client: TestClient, world: World, daemon: mps.MpsDaemon
) -> None:
    register(db, tmp_path, "h200-host", "NVIDIA H200")
    give_default_team_gpus(db=db, gpus_by_type={"H200": 1})
    daemon.stop()
    mps.DAEMON = None  # a host whose worker runs no daemon (KILN_MPS=off or no binary)
    agent_of(tmp_path, "h200-host").heartbeat(db)
    assert db.scalars(select(Host).where(Host.name == "h200-host")).one().mps is None
    r = client.post("/v1/jobs", json=example(name="small", **{"resources.gpu_share": HALF}), headers=world.h("admin"))
    assert r.status_code == 201, r.text
    cycle(db, utcnow() + timedelta(seconds=1))
    job = db.get(Job, r.json()["id"])
    assert job is not None and job.state == "QUEUED" and "no GPU has room" in (job.pending_message or "")


def test_a_dead_daemon_is_restarted_and_said_so(db: Session, tmp_path: Path, daemon: mps.MpsDaemon) -> None:
    import os
    import signal

    register(db, tmp_path, "h200-host", "NVIDIA H200")
    agent = agent_of(tmp_path, "h200-host")
    os.kill(int((daemon.pipe_dir / "standin-daemon.pid").read_text()), signal.SIGKILL)
    for _ in range(100):
        if not daemon.healthy():
            break
    agent.heartbeat(db)
    assert daemon.generation == 2
    event = db.scalars(select(Event).where(Event.type == "MPS_RESTARTED")).one()
    assert "the MPS daemon died and was started again" in event.message
    assert db.scalars(select(Host).where(Host.name == "h200-host")).one().mps == "running"
    assert agent.metrics.registry.get_sample_value("kiln_worker_mps_restarts_total") == 1
    assert agent.metrics.registry.get_sample_value("kiln_worker_mps_running") == 1


@pytest.mark.parametrize(
    ("share", "changes", "loc", "says"),
    [
        ({"memory_gb": 40}, {"resources.gpus": 2}, "resources", "gpu_share is a fraction of one GPU"),
        ({"sm_percent": 50}, {}, "resources.gpu_share.memory_gb", "has no GPU memory cap to share by"),
        ({"memory_gb": 2}, {}, "resources.gpu_share.memory_gb", "does not fit the share of 2.0 GiB"),
        ({"memory_gb": 40, "sm_percent": 101}, {}, "resources.gpu_share.sm_percent", "less than or equal to 100"),
    ],
)
def test_a_share_that_cannot_work_is_refused_at_submit(
    db: Session,
    tmp_path: Path,
    client: TestClient,
    world: World,
    share: dict[str, object],
    changes: dict[str, object],
    loc: str,
    says: str,
) -> None:
    register(db, tmp_path, "h200-host", "NVIDIA H200")
    r = client.post("/v1/jobs", json=example(**{"resources.gpu_share": share, **changes}), headers=world.h("admin"))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["loc"].startswith(loc) and says in err["msg"], err
