"""Forecasts held to account on PostgreSQL: the scheduler's pass records each newly queued job's first start
forecast (and the memory predicted at submit), the worker's relay the trainer's memory prediction, and the pass
settles each against what the job measured; ``GET /v1/usage`` summarises the errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.forecast_errors import GPU_HOURS, PEAK_MEMORY, START_TIME, STEP_TIME
from core.models import Attempt, Forecast, Job, JobMetric, Usage
from core.services.forecasts import record_forecast
from core.states import JobState
from core.transitions import transition
from scheduler.live import forecast_record
from tests.integration import test_scheduler_support as f
from tests.integration.test_scheduler_loop import cycle
from tests.support.api import World, spec
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
    # The run time the policy plans with, on its 8 GPUs: half of its 600 s limit.
    assert forecast[(GPU_HOURS, "scheduler")].predicted == pytest.approx(300 * 8 / 3600)

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
    # Its memory is settled once it has ended, not before; the first's GPU-hours are: 986 s on 8 GPUs.
    assert forecasts_of(db, second)[(PEAK_MEMORY, "submit")].settled_at is None
    hours = forecasts_of(db, first)[(GPU_HOURS, "scheduler")]
    assert (hours.predicted, hours.actual) == (pytest.approx(1800 * 8 / 3600), pytest.approx(986 * 8 / 3600))


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


def test_a_burst_past_the_pass_budget_is_said_not_to_be_forecast(db: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecast_record, "BUDGET_S", 0.0)  # spent by the first job: one job per pass at least
    t = f.team(db, "ml")
    f.host(db, "h1", 8, now=T0)
    jobs = [f.job(db, t, f.qos(db, "silver"), gpus=8, submitted_at=T0, time_limit_s=600) for _ in range(3)]
    assert cycle(db, T0 + timedelta(seconds=1)).forecasts.forecast == 1
    starts = [forecasts_of(db, job)[(START_TIME, "scheduler")] for job in jobs]
    assert starts[0].predicted == 0.0 and starts[0].note and starts[0].note.startswith("the scheduler's plan")
    assert [(s.predicted, s.note) for s in starts[1:]] == [
        (None, "not forecast: the pass's 0 s went to 1 job(s) before it")
    ] * 2
    assert (GPU_HOURS, "scheduler") not in forecasts_of(db, jobs[1])


def trained(db: Session, job: Job, attempt: Attempt, steps: list[tuple[float, int | None, str | None]]) -> None:
    """The worker's relay of ``steps`` (step time, peak memory, kiln's own overhead) of ``attempt``."""
    attempt.first_step_at = attempt.started_at
    for number, (seconds, peak, overhead) in enumerate(steps, start=1):
        metric = JobMetric(job_id=job.id, attempt_id=attempt.id, step=number, step_time_s=seconds, overhead=overhead)
        metric.mem_peak_bytes = peak
        db.add(metric)
    db.flush()


def test_memory_step_time_and_gpu_hours_are_settled_when_the_job_ends(db: Session) -> None:
    t = f.team(db, "ml")
    f.host(db, "h1", 8, now=T0)
    silver = f.qos(db, "silver")
    # A run of the same recipe and shape before it: kiln estimate's measured history.
    earlier = f.job(db, t, silver, gpus=2, name="earlier", submitted_at=T0, time_limit_s=3600)
    cycle(db, T0)
    trained(db, earlier, f.start(db, earlier, now=T0), [(0.2, None, None)] * 20)
    finish(db, earlier, now=T0 + timedelta(seconds=60))
    later = T0 + timedelta(minutes=2)
    job = f.job(db, t, silver, gpus=2, submitted_at=later, time_limit_s=3600)
    assert cycle(db, later).admitted == [job.id]
    estimated = forecasts_of(db, job)[(STEP_TIME, "estimate")]
    assert estimated.predicted == pytest.approx(0.2) and estimated.note and estimated.note.startswith("measured: ")
    attempt = f.start(db, job, now=later)
    # The trainer's prediction, relayed by the worker: the first attempt's is the one held to account.
    prediction = {"kind": "memory_prediction", "rank": 0, "ts": (later + timedelta(seconds=9)).timestamp()}
    relay(db, job=job, attempt=attempt, state=RelayState(), records=[{**prediction, "predicted_peak_bytes": 10 * GIB}])
    relay(db, job=job, attempt=attempt, state=RelayState(), records=[{**prediction, "predicted_peak_bytes": 99 * GIB}])
    # Steady steps as the estimate counts them: the first fifth left out (a warm-up), and the checkpoint's save.
    warmup = [(2.0, 9 * GIB, None), (1.5, 9 * GIB, None)]
    steady = [(0.2, 11 * GIB, None), (0.3, 10 * GIB, None), (0.2, None, None), (0.3, 12 * GIB, "save")]
    trained(db, job, attempt, [*warmup, *steady, *[(0.2, None, None), (0.3, None, None)] * 3])
    cycle(db, later + timedelta(seconds=30))
    assert forecasts_of(db, job)[(PEAK_MEMORY, "trainer")].settled_at is None  # still running

    finish(db, job, now=later + timedelta(minutes=30))  # 2 GPUs for half an hour
    cycle(db, later + timedelta(minutes=31))
    got = {key: (r.predicted, r.actual) for key, r in forecasts_of(db, job).items()}
    assert got[(PEAK_MEMORY, "trainer")] == (10 * GIB, 12 * GIB)  # the highest peak any step reported
    assert got[(STEP_TIME, "estimate")] == (
        pytest.approx(0.2),
        pytest.approx(0.2),
    )  # 5 of the 8 steady steps took 0.2 s
    assert got[(GPU_HOURS, "estimate")][0] and got[(GPU_HOURS, "estimate")][1] == pytest.approx(1.0)
    # The policy learnt from the team's one finished job (60 s of its hour, under the 5% it assumes at least):
    # 180 s on 2 GPUs, where it ran half an hour.
    assert got[(GPU_HOURS, "scheduler")] == (pytest.approx(0.1), pytest.approx(1.0))
    assert got[(START_TIME, "scheduler")] == (0.0, 0.0)


def test_a_recipe_never_measured_has_no_step_time_estimate(db: Session) -> None:
    t = f.team(db, "ml")
    f.host(db, "h1", 8, now=T0)
    job = f.job(db, t, f.qos(db, "silver"), gpus=2, submitted_at=T0, time_limit_s=3600)
    cycle(db, T0)
    estimated = forecasts_of(db, job)[(STEP_TIME, "estimate")]
    assert estimated.predicted is None and estimated.note == "no step time: nothing of this recipe measured or scaled"


def test_an_unknown_kind_or_a_long_source_is_refused(db: Session) -> None:
    t = f.team(db, "ml")
    job = f.job(db, t, f.qos(db, "silver"), gpus=1, submitted_at=T0)
    with pytest.raises(ValueError, match="unknown forecast kind 'loss'"):
        record_forecast(db, job=job, kind="loss", source="estimate", predicted=1.0)
    with pytest.raises(ValueError, match="1 to 16 characters"):
        record_forecast(db, job=job, kind=STEP_TIME, source="a-source-of-17-ch", predicted=1.0)


def test_usage_and_the_job_give_the_teams_forecasts_in_its_window(
    db: Session, client: TestClient, world: World
) -> None:
    now = utcnow()
    alpha = [db.get(Job, world.jobs["alpha"]), *(submitted(db, client, world, "alpha") for _ in range(2))]
    beta = db.get(Job, world.jobs["beta"])
    assert beta is not None and all(alpha)
    for job, (predicted, actual) in zip(
        alpha, [(10 * GIB, 11 * GIB), (10 * GIB, 9 * GIB), (8 * GIB, 8 * GIB)], strict=True
    ):
        settled(db, job, PEAK_MEMORY, "trainer", predicted, actual, made_at=now - timedelta(hours=1))
    settled(db, alpha[0], START_TIME, "scheduler", 60.0, 300.0, made_at=now - timedelta(hours=2), high=600.0)
    settled(db, alpha[1], START_TIME, "scheduler", None, None, made_at=now - timedelta(hours=2))  # cannot be known
    settled(db, alpha[2], START_TIME, "scheduler", 0.0, 5.0, made_at=now - timedelta(days=40))  # before the window
    settled(db, beta, PEAK_MEMORY, "trainer", 1.0, 1000.0, made_at=now - timedelta(hours=1))  # another team's

    r = client.get("/v1/usage", headers=world.h("member"))
    assert r.status_code == 200, r.text
    by_kind = {(e["kind"], e["source"]): e for e in r.json()["forecasts"]}
    assert list(by_kind) == [("start_time", "scheduler"), ("peak_memory", "trainer")]
    start = by_kind[("start_time", "scheduler")]
    assert (start["forecasts"], start["unknown"], start["measured"], start["in_range"]) == (2, 1, 1, 1)
    assert (start["median_abs_error"], start["p90_abs_error"], start["median_rel_error"]) == (240.0, 240.0, None)
    memory = by_kind[("peak_memory", "trainer")]
    assert (memory["forecasts"], memory["measured"], memory["unit"]) == (3, 3, "bytes")
    assert (memory["median_abs_error"], memory["p90_abs_error"], memory["median_error"]) == (GIB, GIB, 0.0)
    assert memory["median_rel_error"] == pytest.approx(1 / 11) and memory["p90_rel_error"] == pytest.approx(1 / 9)

    # Each job's own, on its page: the forecast as made and what was measured.
    r = client.get(f"/v1/jobs/{alpha[0].id}", headers=world.h("viewer"))
    assert r.status_code == 200, r.text
    said = [
        (f["kind"], f["source"], f["unit"], f["predicted"], f["predicted_high"], f["actual"])
        for f in r.json()["forecasts"]
    ]
    assert said == [
        ("start_time", "scheduler", "s", 60.0, 600.0, 300.0),
        ("peak_memory", "trainer", "bytes", 10 * GIB, None, 11 * GIB),
    ]
    assert client.get(f"/v1/jobs/{beta.id}", headers=world.h("viewer")).status_code == 404  # another team's

    # beta's own: its one forecast, 999 bytes off
    r = client.get("/v1/usage", params={"team": "beta"}, headers=world.h("admin"))
    assert [(e["kind"], e["median_abs_error"]) for e in r.json()["forecasts"]] == [("peak_memory", 999.0)]


def submitted(db: Session, client: TestClient, world: World, team: str) -> Job | None:
    r = client.post("/v1/jobs", json=spec(team=team), headers=world.h("member"))
    assert r.status_code == 201, r.text
    return db.get(Job, r.json()["id"])


def settled(
    db: Session,
    job: Job | None,
    kind: str,
    source: str,
    predicted: float | None,
    actual: float | None,
    *,
    made_at: datetime,
    high: float | None = None,
) -> None:
    assert job is not None
    row = record_forecast(
        db, job=job, kind=kind, source=source, predicted=predicted, predicted_high=high, made_at=made_at
    )
    row.actual, row.settled_at = actual, made_at + timedelta(minutes=5)
    db.flush()
