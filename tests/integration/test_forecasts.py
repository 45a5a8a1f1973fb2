"""Forecasts held to account on PostgreSQL: the scheduler's pass records each newly queued job's first start
forecast (and the memory predicted at submit), the worker's relay the trainer's memory prediction, and the pass
settles each against what the job measured; ``GET /v1/usage`` summarises the errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.forecast_errors import GPU_HOURS, PEAK_MEMORY, START_TIME, STEP_TIME
from core.models import Attempt, Forecast, Job, JobMetric, Usage
from core.services.forecasts import record_forecast
from core.states import JobState
from core.transitions import transition
from tests.integration import test_scheduler_support as f
from tests.integration.test_scheduler_loop import cycle
from workers.telemetry_relay import RelayState, relay

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
GIB = 1024**3


def forecasts_of(db: Session, job: Job) -> dict[tuple[str, str], Forecast]:
    return {(r.kind, r.source): r for r in db.scalars(select(Forecast).where(Forecast.job_id == job.id))}


def finish(db: Session, job: Job, *, now: datetime) -> None:
    """The worker's side of a job's end: its attempt and usage close, the job succeeds."""
    attempt = db.scalars(select(Attempt).where(Attempt.job_id == job.id, Attempt.ended_at.is_(None))).one()
    attempt.state, attempt.ended_at = "SUCCEEDED", now
    for u in db.scalars(select(Usage).where(Usage.attempt_id == attempt.id)):
        u.ended_at, u.gpu_seconds = now, u.gpus * (now - u.started_at).total_seconds()
    transition(db, job, JobState.SUCCEEDED, now=now)
    db.flush()


def test_the_first_start_forecast_is_kept_and_settled_by_the_first_start(db: Session) -> None:
    t = f.team(db, "ml")
    f.host(db, "h1", 8, now=T0)
    silver = f.qos(db, "silver")
    first = f.job(db, t, silver, gpus=8, name="first", submitted_at=T0, time_limit_s=3600)
    assert cycle(db, T0).admitted == [first.id]
    f.start(db, first, now=T0 + timedelta(seconds=4))
    second = f.job(db, t, silver, gpus=8, name="second", submitted_at=T0 + timedelta(seconds=10), time_limit_s=600)
    second.predicted_memory_bytes = 30 * GIB
    cycle(db, T0 + timedelta(seconds=20))

    # The first job, admitted by the cycle that first saw it, was forecast to start then; it started 4 s later.
    start = forecasts_of(db, first)[(START_TIME, "scheduler")]
    assert (start.predicted, start.actual, start.made_at) == (0.0, 4.0, T0)
    # The second waits behind it: earliest when the first has used half of what is left of its hour (a team without
    # history uses half its limits): (3600 - 16) / 2 s after the forecast; latest at its limit plus the grace.
    forecast = forecasts_of(db, second)
    start = forecast[(START_TIME, "scheduler")]
    assert start.made_at == T0 + timedelta(seconds=20) and start.settled_at is None
    assert start.predicted == pytest.approx((3600 - 16) / 2)
    assert start.predicted_high is not None and start.predicted_high > 3604 - 20
    assert start.note and "plan run forward" in start.note
    memory = forecast[(PEAK_MEMORY, "submit")]
    assert (memory.predicted, memory.made_at) == (30 * GIB, second.submitted_at)

    # A later pass keeps the first forecast as it was made.
    cycle(db, T0 + timedelta(seconds=600))
    assert forecasts_of(db, second)[(START_TIME, "scheduler")].predicted == pytest.approx(1792)

    # The first job ends early; the second starts at T0 + 1000 s: 980 s after its forecast was made.
    finish(db, first, now=T0 + timedelta(seconds=990))
    assert cycle(db, T0 + timedelta(seconds=995)).admitted == [second.id]
    f.start(db, second, now=T0 + timedelta(seconds=1000))
    cycle(db, T0 + timedelta(seconds=1001))
    start = forecasts_of(db, second)[(START_TIME, "scheduler")]
    assert start.actual == pytest.approx(980.0) and start.settled_at == T0 + timedelta(seconds=1001)
    # Its memory is settled once it has ended, not before.
    assert forecasts_of(db, second)[(PEAK_MEMORY, "submit")].settled_at is None


def test_a_start_no_clock_bounds_is_recorded_as_unknown(db: Session) -> None:
    t = f.team(db, "ml", budget=0.0)  # no GPU-hour left: it waits for the next budget period
    f.host(db, "h1", 8, now=T0)
    job = f.job(db, t, f.qos(db, "silver"), gpus=8, submitted_at=T0, time_limit_s=600)
    cycle(db, T0 + timedelta(seconds=1))
    db.refresh(job)
    assert job.pending_reason == "Budget"
    start = forecasts_of(db, job)[(START_TIME, "scheduler")]
    assert start.predicted is None and start.note and start.note.startswith("cannot be known: it waits for the team")
    # Cancelled before it ever ran: settled, with nothing measured.
    transition(db, job, JobState.CANCELLED, now=T0 + timedelta(seconds=5))
    cycle(db, T0 + timedelta(seconds=6))
    start = forecasts_of(db, job)[(START_TIME, "scheduler")]
    assert start.settled_at is not None and start.actual is None


def test_memory_step_time_and_gpu_hours_are_settled_when_the_job_ends(db: Session) -> None:
    t = f.team(db, "ml")
    f.host(db, "h1", 8, now=T0)
    job = f.job(db, t, f.qos(db, "silver"), gpus=2, submitted_at=T0, time_limit_s=3600)
    assert cycle(db, T0).admitted == [job.id]
    attempt = f.start(db, job, now=T0)
    # The trainer's prediction, relayed by the worker: the first attempt's is the one held to account.
    prediction = {"kind": "memory_prediction", "rank": 0, "ts": (T0 + timedelta(seconds=9)).timestamp()}
    relay(db, job=job, attempt=attempt, state=RelayState(), records=[{**prediction, "predicted_peak_bytes": 10 * GIB}])
    relay(db, job=job, attempt=attempt, state=RelayState(), records=[{**prediction, "predicted_peak_bytes": 99 * GIB}])
    # An estimate of step time and GPU-hours, as the estimate's own code would record it.
    record_forecast(db, job=job, kind=STEP_TIME, source="estimate", predicted=0.25, made_at=T0)
    record_forecast(db, job=job, kind=GPU_HOURS, source="estimate", predicted=0.5, made_at=T0)
    for step, (seconds, peak, overhead) in enumerate(
        [(2.0, 9 * GIB, None), (0.2, 11 * GIB, None), (0.3, 10 * GIB, None), (0.3, 12 * GIB, "save"), (0.2, None, None)]
    ):
        db.add(
            JobMetric(
                job_id=job.id,
                attempt_id=attempt.id,
                step=step + 1,
                step_time_s=seconds,
                mem_peak_bytes=peak,
                overhead=overhead,
            )
        )
    cycle(db, T0 + timedelta(seconds=30))
    assert forecasts_of(db, job)[(PEAK_MEMORY, "trainer")].settled_at is None  # still running

    finish(db, job, now=T0 + timedelta(minutes=30))  # 2 GPUs for half an hour
    cycle(db, T0 + timedelta(minutes=31))
    got = {key: (r.predicted, r.actual) for key, r in forecasts_of(db, job).items()}
    assert got[(PEAK_MEMORY, "trainer")] == (10 * GIB, 12 * GIB)  # the highest peak any step reported
    assert got[(STEP_TIME, "estimate")] == (0.25, pytest.approx(0.25))  # median of 2.0, 0.2, 0.3, 0.2 (not the save)
    assert got[(GPU_HOURS, "estimate")] == (0.5, pytest.approx(1.0))
    assert got[(START_TIME, "scheduler")] == (0.0, 0.0)


def test_an_unknown_kind_is_refused(db: Session) -> None:
    t = f.team(db, "ml")
    job = f.job(db, t, f.qos(db, "silver"), gpus=1, submitted_at=T0)
    with pytest.raises(ValueError, match="unknown forecast kind 'loss'"):
        record_forecast(db, job=job, kind="loss", source="estimate", predicted=1.0)
