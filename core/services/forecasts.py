"""Forecasts held to account: what kiln foretold for a job, recorded once, settled against what the job measured.

Who records what (``record_forecast``; the first forecast of a kind by a source is kept, later ones are not):

* the scheduler, in the first pass that sees the job queued: its expected start (``start_time``, the range
  ``kiln why`` would have said), the memory predicted at submit (``peak_memory`` by ``submit``), the GPU-hours of
  the run time the policy plans with (``gpu_hours`` by ``scheduler``), and the step time and GPU-hours ``kiln
  estimate`` gives for the job as written (``record_estimate``: ``step_time`` and ``gpu_hours`` by ``estimate``);
* the worker's relay: the trainer's own memory prediction, made on the device it runs on (``peak_memory`` by
  ``trainer``);
* any other forecaster: ``record_forecast`` with a ``source`` of its own.

The scheduler's pass settles them (``settle``): a start once the job's first attempt runs, the rest once the job
has ended: its highest reported peak memory, its median step time (steps without kiln's checkpoint or restore
work), its GPU-hours from the usage records. ``summary`` gives the errors per kind and source
(``core.forecast_errors``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from core.db import utcnow
from core.forecast_errors import (
    ESTIMATE,
    GPU_HOURS,
    KINDS,
    PEAK_MEMORY,
    START_TIME,
    STEP_TIME,
    ErrorSummary,
    Outcome,
    summarize,
)
from core.models import Forecast, Job
from core.repositories import forecasts as repo
from core.repositories import teams as teams_repo
from core.services.estimates import priced_options
from core.services.fit import canonical_gpu_type
from core.services.principal import Principal
from core.spec import SpecError, check_recipe, parse_spec_data


def record_forecast(
    db: Session,
    *,
    job: Job,
    kind: str,
    source: str,
    predicted: float | None,
    predicted_high: float | None = None,
    note: str | None = None,
    made_at: datetime | None = None,
) -> Forecast:
    """Keep ``job``'s forecast of ``kind`` (``core.forecast_errors.KINDS``, in that kind's unit; a start as seconds
    after ``made_at``) by ``source``, unless that source already made one: the forecast held to account is the
    first. ``predicted`` None: kiln said it cannot be known (``note``: why)."""
    if kind not in KINDS:
        raise ValueError(f"unknown forecast kind {kind!r}: one of {', '.join(KINDS)}")
    if not 0 < len(source) <= 16:
        raise ValueError(f"a forecast's source is 1 to 16 characters, not {source!r}")
    row = repo.get(db, job_id=job.id, kind=kind, source=source)
    if row is None:
        row = Forecast(
            job_id=job.id,
            team_id=job.team_id,
            kind=kind,
            source=source,
            predicted=predicted,
            predicted_high=predicted_high,
            note=note[:512] if note else None,
            made_at=made_at or utcnow(),
        )
        db.add(row)
        db.flush()
    return row


def record_estimate(db: Session, *, job: Job, made_at: datetime) -> None:
    """The step time and GPU-hours ``kiln estimate`` gives for ``job`` as written (the first of its options), held
    to account as ``estimate``'s forecasts; a step time it cannot give (nothing of the recipe measured or scaled) is
    recorded as unknown. A stored spec today's schema no longer reads is not estimated."""
    try:
        spec = canonical_gpu_type(parse_spec_data(job.spec))
    except SpecError:
        return
    hp = check_recipe(spec)
    written = priced_options(db, spec=spec, hp=hp, team_id=job.team_id, now=made_at, prices={}).options[0]
    step = written.step
    note = f"{step.basis}: {step.detail}" if step else "no step time: nothing of this recipe measured or scaled"
    predicted = step.median_s if step else None
    record_forecast(db, job=job, kind=STEP_TIME, source=ESTIMATE, predicted=predicted, note=note, made_at=made_at)
    record_forecast(
        db, job=job, kind=GPU_HOURS, source=ESTIMATE, predicted=written.gpu_hours, note=note, made_at=made_at
    )


def settle(db: Session, *, now: datetime) -> int:
    """Write the measured value of every forecast whose job can now tell it; returns how many were settled."""
    rows = repo.due(db)
    for forecast, job in rows:
        forecast.actual = _measured(db, forecast, job)
        forecast.settled_at = now
    return len(rows)


def _measured(db: Session, forecast: Forecast, job: Job) -> float | None:
    if forecast.kind == START_TIME:
        started = repo.first_start(db, job.id)
        return (started - forecast.made_at).total_seconds() if started is not None else None
    if forecast.kind == PEAK_MEMORY:
        peak = repo.peak_memory(db, job.id)
        return float(peak) if peak is not None else None
    if forecast.kind == STEP_TIME:
        steps = repo.step_times(db, job.id)
        return statistics.median(steps) if steps else None
    if forecast.kind == GPU_HOURS:
        seconds = repo.gpu_seconds(db, job.id)
        return seconds / 3600.0 if seconds is not None else None
    return None


def of_job(db: Session, *, job_id: int) -> list[Forecast]:
    """A job's forecasts, each with what was measured (the caller has checked the job is visible)."""
    order = list(KINDS)
    return sorted(repo.of_job(db, job_id), key=lambda f: (order.index(f.kind), f.source))


def summary(db: Session, *, team_ids: Sequence[int], since: datetime, until: datetime) -> list[ErrorSummary]:
    """The errors of the forecasts made for these teams' jobs in [since, until), per kind and source."""
    groups: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for kind, source, predicted, actual, high in repo.made_between(db, team_ids=team_ids, since=since, until=until):
        groups[(kind, source)].append(Outcome(predicted, actual, high))
    order = list(KINDS)
    keys = sorted(groups, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[1]))
    return [summarize(kind, source, groups[(kind, source)]) for kind, source in keys]


def visible_summary(db: Session, *, principal: Principal, since: datetime, until: datetime) -> list[ErrorSummary]:
    """``summary`` over the teams ``principal`` sees (the dashboard's cost page)."""
    teams = [t.id for t in teams_repo.list_teams(db, principal.visible_team_ids())]
    return summary(db, team_ids=teams, since=since, until=until)
