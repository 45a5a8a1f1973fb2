"""Checkpoint exports are started by the job's team's members (and team-admins), not its viewers: an export makes a
worker convert the weights and writes a copy of them to storage, which a viewer (read-only) may not cause.

Before: any role in the job's team requested one; a viewer's POST answered 202 and queued the conversion. Now a
viewer gets 403, as for the team's other writes (cancel, hold); a caller outside the team, 404 (the job does not
exist for them, docs/security.md). Reading the team's exports stays open to its viewers."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Checkpoint, CheckpointExport
from tests.support.api import World

pytestmark = pytest.mark.integration


def _verified_checkpoint(db: Session, job_id: int, step: int = 5) -> None:
    db.add(
        Checkpoint(job_id=job_id, step=step, path=f"/nowhere/{job_id}/{step}", bytes=1, sha256="0" * 64, verified=True)
    )
    db.flush()


def _exports(db: Session, job_id: int) -> int:
    return int(db.scalar(select(func.count()).where(CheckpointExport.job_id == job_id)) or 0)


@pytest.mark.parametrize(
    ("role", "status"), [("viewer", 403), ("beta-member", 404), ("member", 202), ("team-admin", 202)]
)
def test_only_members_of_the_jobs_team_start_an_export(
    client: TestClient, world: World, db: Session, role: str, status: int
) -> None:
    job_id = world.jobs["alpha"]
    _verified_checkpoint(db, job_id)
    r = client.post(f"/v1/jobs/{job_id}/exports", json={}, headers=world.h(role))
    assert r.status_code == status, r.text
    assert _exports(db, job_id) == (1 if status == 202 else 0)
    if status == 403:
        assert "viewer" in r.json()["detail"] and "member" in r.json()["detail"]


def test_a_viewer_still_reads_the_teams_exports(client: TestClient, world: World, db: Session) -> None:
    job_id = world.jobs["alpha"]
    _verified_checkpoint(db, job_id)
    assert client.post(f"/v1/jobs/{job_id}/exports", json={"step": 5}, headers=world.h("member")).status_code == 202
    listed = client.get(f"/v1/jobs/{job_id}/exports", headers=world.h("viewer"))
    assert listed.status_code == 200 and [e["step"] for e in listed.json()["items"]] == [5]
    assert client.get(f"/v1/jobs/{job_id}/exports/5", headers=world.h("viewer")).status_code == 200
    # ... and asking again for an export that exists is a request too: refused to a viewer, as the first one.
    assert client.post(f"/v1/jobs/{job_id}/exports", json={"step": 5}, headers=world.h("viewer")).status_code == 403
