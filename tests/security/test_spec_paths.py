"""No path in a job spec may leave kiln's own per-job directories: the spec names no directory at all.

Before: ``checkpointing.local_dir`` was used as given, so a member made the worker write checkpoints to an
absolute path, through ``../../..``, and into another team's checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from core.trainer_protocol import ENV_LOCAL_CHECKPOINT_DIR
from tests.support.api import World, spec
from workers.attempt_env import attempt_env, local_tier_dir
from workers.claimed import Claimed

pytestmark = pytest.mark.integration

AIMED = ("/etc/kiln", "../../../../tmp/escape", "/var/lib/kiln/storage/checkpoints/2")


@pytest.mark.parametrize("path", AIMED)
def test_a_spec_cannot_name_a_checkpoint_directory(client: TestClient, world: World, path: str) -> None:
    body = spec(name="aimed", checkpointing={"every_steps": 5, "local_dir": path})
    r = client.post("/v1/jobs", json=body, headers=world.h("member"))
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["loc"] == "checkpointing.local_dir"
    assert "local_tier: true" in error["msg"]  # the error names the replacement


def _claimed(job_id: int, checkpointing: dict[str, Any], deployment: str = "d1") -> Claimed:
    return Claimed(
        job_id=job_id,
        team_id=1,
        attempt_number=1,
        spec={"checkpointing": checkpointing},
        placement=[{}],
        gpus=[],
        qos=None,
        host_links={},
        rendezvous=None,
        ran_before_s=0.0,
        deployment=deployment,
    )


def test_the_local_tier_is_a_directory_the_worker_names_per_job(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, local_tier_dir=tmp_path / "shm")
    # A job spec stored before the change still carries the old field: the worker never reads it.
    claimed = _claimed(7, {"local_tier": True, "local_dir": "/etc"})
    local = local_tier_dir(settings, claimed)
    assert local == (tmp_path / "shm").resolve() / "d1" / "jobs" / "7"
    env = attempt_env(
        claimed,
        attempt_id=1,
        token=1,
        checkpoint_dir=tmp_path / "c",
        compile_dir=tmp_path / "cc",
        lease_file=tmp_path / "lease",
        local_dir=local,
    )
    assert env[ENV_LOCAL_CHECKPOINT_DIR] == str(local)
    assert local_tier_dir(settings, _claimed(7, {"local_dir": "/etc"})) is None  # not asked for: no tier
    assert local_tier_dir(Settings(home=tmp_path, local_tier_dir=""), claimed) is None  # a host without one


def test_two_databases_on_one_host_keep_their_jobs_apart_in_its_local_tier(tmp_path: Path) -> None:
    """The host's tier is shared by every kiln on it; job numbers restart with each database. Before, a new
    database's job 1 found the old job 1's checkpoint of step 2,000 there and finished at once, SUCCEEDED, with
    the other job's loss (seen on the H200: a second ``kiln up`` on the host, the shipped example)."""
    settings = Settings(home=tmp_path, local_tier_dir=tmp_path / "shm")
    first = local_tier_dir(settings, _claimed(1, {"local_tier": True}, deployment="a" * 32))
    second = local_tier_dir(settings, _claimed(1, {"local_tier": True}, deployment="b" * 32))
    assert first is not None and second is not None and first != second
    assert not second.is_relative_to(first) and not first.is_relative_to(second)
