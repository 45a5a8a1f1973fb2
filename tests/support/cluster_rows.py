"""Reading a :class:`~harness.workers_cluster.Cluster`'s database from a test: a job, its attempts, its
events; and what its checkpoints hold on disk."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from core.fence import job_checkpoint_dir
from core.models import Attempt, Event, Job
from core.settings import get_settings
from core.states import TERMINAL
from harness.workers_cluster import Cluster


def job_row(c: Cluster, job_id: int) -> Job:
    """The job as the database has it now (a fresh session each call)."""
    with c.sessionmaker()() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job


def matched_its_twin(c: Cluster, job_id: int, twin_id: int, *, steps: int) -> tuple[Job, Job]:
    """Assert that the job, restarted once, and its uninterrupted twin both succeeded at ``steps`` with the same
    loss (a resume from a verified checkpoint restores the data position, RNG and optimizer state); both rows."""
    job, twin = job_row(c, job_id), job_row(c, twin_id)
    assert job.state == "SUCCEEDED", job.exit_reason
    assert twin.state == "SUCCEEDED", twin.exit_reason
    assert job.restart_count == 1
    assert job.last_step == twin.last_step == steps
    assert job.last_loss == pytest.approx(twin.last_loss, rel=1e-6, abs=1e-6)
    return job, twin


def finished_state(c: Cluster, job_id: int) -> str | None:
    """The job's final state (SUCCEEDED, FAILED, CANCELLED) once it has one, else None: a ``wait_for`` predicate."""
    state = job_row(c, job_id).state
    return state if state in TERMINAL else None


def job_attempts(c: Cluster, job_id: int) -> list[Attempt]:
    """The job's attempts, first to last."""
    with c.sessionmaker()() as db:
        return list(db.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)).all())


def job_events(c: Cluster, job_id: int, type_: str | None = None) -> list[Event]:
    """The job's events (only those of ``type_`` when given), oldest first."""
    with c.sessionmaker()() as db:
        q = select(Event).where(Event.job_id == job_id).order_by(Event.id)
        if type_:
            q = q.where(Event.type == type_)
        return list(db.scalars(q).all())


def checkpoint_manifests(job_id: int) -> dict[int, dict[str, Any]]:
    """The manifests of the job's checkpoints on disk (in the active cluster's storage), by step."""
    root = job_checkpoint_dir(get_settings().resolved_storage_dir, job_id)
    return {int(p.name[5:]): json.loads((p / "manifest.json").read_text()) for p in root.glob("step_*")}
