"""Attempts as a worker would have recorded them, made with known figures where no worker runs: a finished one (the
attempt, its usage, its steps' times: the measured history ``kiln estimate`` reads) and a running one (what the
scheduler's projection sees ahead of a queued job)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

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


def set_running(db: Session, job: Job, placement: dict[str, Any], started: datetime, **attempt: Any) -> None:
    """``job`` running on ``placement`` (one host's share) since ``started``, its first attempt with it."""
    job.state, job.admitted_at, job.started_at = "RUNNING", started, started
    db.add(
        Attempt(
            job_id=job.id,
            number=1,
            fencing_token=job.fencing_token,
            placement=[placement],
            state="RUNNING",
            started_at=started,
            **attempt,
        )
    )
    db.flush()
