"""What ``kiln estimate`` reads: the measured attempts of a recipe, their steady steps, how they actually ran, and
the GPU types where a GPU share can run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import GPU, Attempt, Event, Host, Job, JobMetric, Usage
from core.repositories.step_times import CHUNK, WARMUP_STEPS
from core.states import MpsState

RECENT_ATTEMPTS = 200  # a recipe's newest measured attempts: the calibration follows the newest runs
STEADY_STEPS = 500  # an attempt's newest steady steps read (the dashboard asks as the user types)


class MeasuredAttempt(NamedTuple):
    job_id: int
    spec: dict[str, Any]
    attempt_id: int
    number: int
    gpu_type: str | None  # the type its usage was charged under (None: no usage row)
    started_at: datetime | None
    first_step_at: datetime


def measured_attempts(db: Session, *, recipe: str | None, team_id: int | None) -> list[MeasuredAttempt]:
    """Ended attempts that trained at least one step, of jobs whose spec names ``recipe`` (None: of script jobs, which
    name a command instead), of ``team_id`` only where given (a team's own code is its own business), newest
    first."""
    named = Job.spec[("recipe", "name")].as_string() == recipe if recipe is not None else None
    script = Job.spec["command"].as_string().is_not(None)  # JSON null (no command) reads as SQL NULL on both
    stmt = (
        select(Job.id, Job.spec, Attempt.id, Attempt.number, Usage.gpu_type, Attempt.started_at, Attempt.first_step_at)
        .join(Attempt, Attempt.job_id == Job.id)
        .outerjoin(Usage, Usage.attempt_id == Attempt.id)
        .where(
            named if named is not None else script,
            Attempt.ended_at.is_not(None),
            Attempt.first_step_at.is_not(None),
        )
        .order_by(Attempt.id.desc())
        .limit(RECENT_ATTEMPTS)
    )
    if team_id is not None:
        stmt = stmt.where(Job.team_id == team_id)
    return [MeasuredAttempt(*row) for row in db.execute(stmt).tuples()]


def steady_steps(db: Session, attempt_ids: Sequence[int]) -> dict[int, list[tuple[float, int | None]]]:
    """Per attempt, its steady steps' (time, peak memory), oldest first: of the steps with a time and no overhead of
    kiln's own (a checkpoint's or a restore's, as the step-time SLA counts them), those after the first fifth (at
    most ``WARMUP_STEPS``: the compile's last traces, the allocator's growth, the first checkpoint's staging), the
    newest ``STEADY_STEPS`` of them, ranked in the database so that a long run's rows do not all travel."""
    out: dict[int, list[tuple[float, int | None]]] = defaultdict(list)
    for start in range(0, len(attempt_ids), CHUNK):
        part, order = JobMetric.attempt_id, (JobMetric.step, JobMetric.id)
        ranked = (
            select(
                JobMetric.attempt_id,
                JobMetric.step_time_s,
                JobMetric.mem_peak_bytes,
                func.row_number().over(partition_by=part, order_by=order).label("first"),
                func.row_number().over(partition_by=part, order_by=[c.desc() for c in order]).label("last"),
                func.count().over(partition_by=part).label("count"),
            )
            .where(
                JobMetric.attempt_id.in_(attempt_ids[start : start + CHUNK]),
                JobMetric.step_time_s.is_not(None),
                JobMetric.overhead.is_(None),
            )
            .subquery()
        )
        warmup = case((ranked.c.count / 5 < WARMUP_STEPS, ranked.c.count / 5), else_=WARMUP_STEPS)
        stmt = (
            select(ranked.c.attempt_id, ranked.c.step_time_s, ranked.c.mem_peak_bytes)
            .where(ranked.c.first > warmup, ranked.c.last <= STEADY_STEPS)
            .order_by(ranked.c.attempt_id, ranked.c.first)
        )
        for attempt_id, step_time, peak in db.execute(stmt).tuples():
            if attempt_id is not None and step_time is not None:  # both are in the WHERE: for the type checker
                out[attempt_id].append((float(step_time), peak))
    return out


def run_events(db: Session, job_ids: Sequence[int]) -> tuple[dict[int, str], set[tuple[int, int]]]:
    """How the jobs' attempts ran, from their events: each job's parallelism as the trainer resolved it (its latest
    ``MEMORY_PREDICTION``'s strategy), and the (job, attempt number) pairs whose compile fell back to eager."""
    strategy: dict[int, str] = {}
    fell_back: set[tuple[int, int]] = set()
    for start in range(0, len(job_ids), CHUNK):
        stmt = (
            select(Event.job_id, Event.type, Event.data)
            .where(
                Event.job_id.in_(job_ids[start : start + CHUNK]),
                (Event.type == EventType.MEMORY_PREDICTION) | Event.type.startswith("FALLBACK_"),
            )
            .order_by(Event.id)
        )
        for job_id, kind, data in db.execute(stmt).tuples():
            if kind == EventType.MEMORY_PREDICTION and isinstance(data.get("strategy"), str):
                strategy[job_id] = data["strategy"]
            elif isinstance(data.get("attempt"), int):
                fell_back.add((job_id, data["attempt"]))
    return strategy, fell_back


def share_gpu_types(db: Session) -> set[str]:
    """GPU types of hosts whose MPS daemon answers: where the scheduler places GPU shares (a worker that sandboxes
    runs no daemon: README, GPU shares)."""
    stmt = select(GPU.model).join(Host, Host.id == GPU.host_id).where(Host.mps == MpsState.RUNNING.value).distinct()
    return set(db.scalars(stmt).all())
