"""Unused code archives are collected: an archive no active job names goes once its last use is older than the
retention; one a running job names stays whatever its age, and so does a recent one. The leader's collection
deletes the rows in its transaction and the files after it committed."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.code_archive import artifact_path
from core.db import utcnow
from core.models import Artifact, Job
from core.services import artifacts
from tests.support.api import World

pytestmark = pytest.mark.integration

DAY = 86400.0


def test_old_unreferenced_archives_go_and_the_rest_stay(
    client: TestClient, world: World, db: Session, tmp_path: Path
) -> None:
    job = db.get(Job, world.jobs["alpha"])
    assert job is not None
    now = utcnow()
    rows = {}
    for name, age_days in (("old", 10), ("recent", 1), ("running", 30)):
        digest = hashlib.sha256(name.encode()).hexdigest()
        path = artifact_path(tmp_path, job.team_id, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        rows[name] = Artifact(
            team_id=job.team_id,
            digest=digest,
            bytes=1,
            unpacked_bytes=1,
            entries=1,
            created_at=now - timedelta(days=age_days),
            last_used_at=now - timedelta(days=age_days),
        )
        db.add(rows[name])
    job.state, job.code_digest = "RUNNING", rows["running"].digest
    db.flush()

    files = artifacts.collect(db, storage=tmp_path, now=now, retention_s=7 * DAY)
    assert files == [artifact_path(tmp_path, job.team_id, rows["old"].digest)]
    assert all(f.exists() for f in files)  # nothing removed before the caller commits
    artifacts.remove_files(files)
    left = set(db.scalars(select(Artifact.digest).where(Artifact.team_id == job.team_id)))
    assert left == {rows["recent"].digest, rows["running"].digest}
    assert not files[0].exists()

    job.state = "SUCCEEDED"  # once no active job names it, an old archive goes too
    db.flush()
    assert artifacts.collect(db, storage=tmp_path, now=now, retention_s=7 * DAY) == [
        artifact_path(tmp_path, job.team_id, rows["running"].digest)
    ]
