"""A finished attempt as the worker would have recorded it (the attempt, its usage, its steps' times): the measured
history ``kiln estimate`` reads, made with known figures where no worker runs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Attempt, Job, JobMetric, Usage


def record_run(db: Session, job_id: int, *, startup_s: float, step_s: Sequence[float], gpu_type: str) -> Attempt:
    """One ended attempt of the job: ``startup_s`` from its start to its first step, then one step per ``step_s``."""
    job = db.get_one(Job, job_id)
    start = utcnow() - timedelta(hours=1)
    first = start + timedelta(seconds=startup_s)
    attempt = Attempt(
        job_id=job_id,
        number=1,
        fencing_token=1,
        state="SUCCEEDED",
        placement=[],
        started_at=start,
        first_step_at=first,
        ended_at=first + timedelta(seconds=sum(step_s)),
    )
    db.add(attempt)
    db.flush()
    db.add(
        Usage(
            team_id=job.team_id,
            job_id=job_id,
            attempt_id=attempt.id,
            gpu_type=gpu_type,
            gpus=job.gpus or 1,
            started_at=start,
            ended_at=attempt.ended_at,
        )
    )
    db.add_all(
        JobMetric(job_id=job_id, attempt_id=attempt.id, step=i + 1, step_time_s=t, loss=1.0)
        for i, t in enumerate(step_s)
    )
    db.flush()
    return attempt
