"""The step times the SLA's step-time term compares: an attempt's baseline against its recent pace.

An attempt is compared with itself. Its usable steps are those reported with a step time and no overhead (a step
that kiln's own checkpoint I/O or a restore overlapped is not the job's pace). Time ``t`` runs from its first
usable step (the trainer's own timestamps), and each window is the wider of a count of steps and a span of time:

| window | steps |
|---|---|
| warm-up | before the later of step ``WARMUP_STEPS + 1`` and ``t = WARMUP_S`` (compile, allocator, first staging) |
| baseline | from there to the later of step ``WARMUP_STEPS + BASELINE_STEPS`` and ``t = WARMUP_S + BASELINE_S`` |
| recent | the last ``RECENT_STEPS``, or the last ``RECENT_S`` seconds when those hold more |

Counts alone were sized for 50 ms steps (the shipped example on the H200: a restart settles over ~35 steps, and
12% of steady steps stall 15-25 ms in short clusters, so a median of 5 steps saw 1.4x in a healthy job). At 5 ms
(four mini GPTs packed on one H200, bench/results/mps_bench_run11.json) 25 steps are an eighth of a second and
whole-GPU jobs alone "violated" 1.3x (one 2.6x) on such blips; the time floors make a violation a slowdown that
lasted seconds. An attempt is measured (compared at all) once it has steps enough for both windows apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import seconds_between
from core.event_types import EventType
from core.models import JobMetric

WARMUP_STEPS = 50
BASELINE_STEPS = 50
RECENT_STEPS = 25
WARMUP_S = 10.0
BASELINE_S = 10.0
RECENT_S = 5.0
MEASURABLE_STEPS = WARMUP_STEPS + BASELINE_STEPS + RECENT_STEPS
MEASURABLE_S = WARMUP_S + BASELINE_S + RECENT_S

CHUNK = 1000  # ids per IN list
VIOLATION = EventType.SLA_STEP_TIME_VIOLATION  # the event, recorded once per attempt


@dataclass(frozen=True)
class Windows:
    """One attempt's usable steps: how many, the seconds they span, and the two windows' step times."""

    count: int
    span_s: float
    baseline: list[float]
    recent: list[float]

    @property
    def measurable(self) -> bool:
        return self.count >= MEASURABLE_STEPS and self.span_s >= MEASURABLE_S


def windows(db: Session, attempts: Mapping[int, int]) -> dict[int, Windows]:
    """Per job of ``attempts`` (job -> the attempt to read) with usable steps: that attempt's ``Windows``, ranked in
    the database so that only the windows' rows travel, whatever the length of the run (a statement per thousand
    jobs)."""
    out: dict[int, Windows] = {}
    job_ids = list(attempts)
    for start in range(0, len(job_ids), CHUNK):
        chunk = job_ids[start : start + CHUNK]
        order = (JobMetric.step, JobMetric.id)
        part = JobMetric.job_id
        first = func.row_number().over(partition_by=part, order_by=order).label("first")
        last = func.row_number().over(partition_by=part, order_by=[c.desc() for c in order]).label("last")
        since = seconds_between(db, JobMetric.ts, func.min(JobMetric.ts).over(partition_by=part)).label("since")
        left = seconds_between(db, func.max(JobMetric.ts).over(partition_by=part), JobMetric.ts).label("left")
        r = (
            select(JobMetric.job_id, JobMetric.step_time_s, first, last, since, left)
            .where(
                JobMetric.job_id.in_(chunk),  # the indexed column; the attempt picks the rows within a job
                JobMetric.attempt_id.in_([attempts[j] for j in chunk]),
                JobMetric.step_time_s.is_not(None),
                JobMetric.overhead.is_(None),
            )
            .subquery()
        )
        baseline = (
            (r.c.first > WARMUP_STEPS)
            & (r.c.since >= WARMUP_S)
            & ((r.c.first <= WARMUP_STEPS + BASELINE_STEPS) | (r.c.since < WARMUP_S + BASELINE_S))
        )
        recent = (r.c.last <= RECENT_STEPS) | (r.c.left < RECENT_S)
        stmt = select(
            r.c.job_id,
            r.c.step_time_s,
            r.c.first,
            r.c.last,
            r.c.since,
            baseline.label("in_baseline"),
            recent.label("in_recent"),
        )
        rows: dict[int, tuple[int, float, list[float], list[float]]] = {}
        for job_id, step_time, n_first, n_last, since_s, in_baseline, in_recent in db.execute(
            stmt.where(baseline | recent).order_by(r.c.job_id, r.c.first)
        ).tuples():
            count, span, base, rec = rows.setdefault(job_id, (0, 0.0, [], []))
            if in_baseline:
                base.append(step_time)
            if in_recent:
                rec.append(step_time)
            if n_last == 1:  # the newest row: its rank from the oldest is the count, its time the span
                count, span = n_first, float(since_s)
            rows[job_id] = (count, span, base, rec)
        out.update({j: Windows(c, s, b, r_) for j, (c, s, b, r_) in rows.items()})
    return out


def violation(w: Windows, tolerance: float, attempt_id: int) -> tuple[str, dict[str, object]] | None:
    """The step-time violation of an attempt, as its event's message and data: its recent median step time past
    ``tolerance`` x its baseline's. None when within, or when nothing can be compared (too early to know the
    attempt's normal pace, or its steps jumped past the baseline's span: a long pause)."""
    if not w.measurable or not w.baseline:
        return None
    baseline = statistics.median(w.baseline)
    recent = statistics.median(w.recent)
    if baseline <= 0 or recent <= tolerance * baseline:
        return None
    message = (
        f"recent step time {recent:.3f}s is {recent / baseline:.2f}x the attempt's baseline {baseline:.3f}s "
        f"(tolerance {tolerance:.2f}x)"
    )
    data: dict[str, object] = {
        "kind": "step_time",
        "attempt_id": attempt_id,
        "recent_s": recent,
        "baseline_s": baseline,
        "tolerance": tolerance,
    }
    return message, data


def measured_jobs(db: Session, job_ids: Sequence[int]) -> set[int]:
    """Those of ``job_ids`` with an attempt whose step time could be compared (``Windows.measurable``): a job
    that reported too few steps, or steps over too short a time, has its step-time term unmeasured, not met."""
    out: set[int] = set()
    for start in range(0, len(job_ids), CHUNK):
        chunk = list(job_ids[start : start + CHUNK])
        span = seconds_between(db, func.max(JobMetric.ts), func.min(JobMetric.ts))
        stmt = (
            select(JobMetric.job_id)
            .where(JobMetric.job_id.in_(chunk), JobMetric.step_time_s.is_not(None), JobMetric.overhead.is_(None))
            .group_by(JobMetric.job_id, JobMetric.attempt_id)
            .having((func.count() >= MEASURABLE_STEPS) & (span >= MEASURABLE_S))
        )
        out.update(db.scalars(stmt).all())
    return out
