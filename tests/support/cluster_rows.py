"""Reading a :class:`~tests.support.workers_cluster.Cluster`'s database from a test: a job, its events."""

from __future__ import annotations

from sqlalchemy import select

from core.models import Event, Job
from tests.support.workers_cluster import Cluster


def job_row(c: Cluster, job_id: int) -> Job:
    """The job as the database has it now (a fresh session each call)."""
    with c.sessionmaker()() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job


def job_events(c: Cluster, job_id: int, type_: str | None = None) -> list[Event]:
    """The job's events (only those of ``type_`` when given), oldest first."""
    with c.sessionmaker()() as db:
        q = select(Event).where(Event.job_id == job_id).order_by(Event.id)
        if type_:
            q = q.where(Event.type == type_)
        return list(db.scalars(q).all())
