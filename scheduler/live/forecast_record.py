"""The scheduler's part in holding forecasts to account (``core.services.forecasts``).

After each cycle, in a transaction of its own (the cycle's locks are released and its attempts dispatched first):

* every job of the cycle's snapshot the scheduler has not seen before (no pending reason stored yet: submitted, or
  released from a hold, since the last cycle) that has never started nor been forecast gets the start forecast
  ``kiln why`` would have given then: the same projection (``StartProjector``) over the cycle's own snapshot,
  taken before ``plan()``, so a job this cycle admitted is forecast to start now, as it was; a reason no clock
  bounds (a dependency, a budget) is recorded as "cannot be known", as ``kiln why`` says it. With it, the
  GPU-hours of the run time the policy plans with, ``kiln estimate``'s step time and GPU-hours for the job as
  written, and the memory predicted at submit (the trainer's own prediction replaces it on the job once it runs);
* every forecast whose job can now tell what happened is settled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from sqlalchemy.orm import Session

from core.forecast_errors import GPU_HOURS, PEAK_MEMORY, SCHEDULER, START_TIME, SUBMIT
from core.models import Job
from core.policy_config import PolicyConfig
from core.repositories import forecasts as forecasts_repo
from core.services import forecasts, why
from scheduler.live.forecast import StartProjector, measured_rates
from scheduler.live.leader import Leadership, LeadershipLost
from scheduler.policy.estimate import Estimator
from scheduler.policy.snapshot import PendingJob, Snapshot

log = logging.getLogger(__name__)

# Forecasts started per pass stop after this long (a start's projection takes 10-20 ms behind a few running jobs, up
# to 1 s for a job 40 ends away on 320 GPUs; the estimate 20 ms on kiln up): the pass delays the next cycle. The
# rest of a burst is recorded as not forecast, since the next pass no longer tells new jobs apart (their pending
# reason is stored), and finding them among 10,000 queued jobs each pass took 150-300 ms on PostgreSQL here.
BUDGET_S = 1.0


@dataclass(frozen=True)
class Recorded:
    forecast: int  # jobs given their first start forecast
    settled: int  # forecasts settled against what their job measured


def record_pass(
    *,
    session_factory: Callable[[], Session],
    snapshot: Snapshot,
    policy: PolicyConfig,
    now: datetime,
    leadership: Leadership | None = None,
) -> Recorded:
    """Forecast the newly queued jobs of ``snapshot`` and settle what can be; a failure is logged, never the
    cycle's (which has committed)."""
    db = session_factory()
    try:
        if leadership is not None:
            leadership.hold(db)
        made = record_starts(db, snapshot, policy, now)
        settled = forecasts.settle(db, now=now)
        db.commit()
        return Recorded(made, settled)
    except LeadershipLost:
        db.rollback()
        raise
    except Exception:
        db.rollback()
        log.exception("recording forecasts failed; the next cycle tries again")
        return Recorded(0, 0)
    finally:
        db.close()


def record_starts(db: Session, snapshot: Snapshot, policy: PolicyConfig, now: datetime) -> int:
    """The first forecasts of each job of ``snapshot`` the scheduler has not yet seen (no pending reason stored:
    submitted or released since the last cycle), oldest first, within ``BUDGET_S``: the rest of a burst is said
    not to have been forecast (an unknown start), since the next cycle no longer tells them apart."""
    new = {p.id: p for p in snapshot.pending if p.pending_reason is None}
    jobs = forecasts_repo.never_forecast(db, kind=START_TIME, source=SCHEDULER, job_ids=new)
    if not jobs:
        return 0
    projector = StartProjector(snapshot, measured_rates(db, now), policy)
    estimator = Estimator(snapshot.teams)
    deadline = time.perf_counter() + BUDGET_S
    for made, job in enumerate(jobs):
        if made and time.perf_counter() > deadline:  # one job at least, so that a pass always gets somewhere
            for late in jobs[made:]:
                note = f"not forecast: the pass's {BUDGET_S:g} s went to {made} job(s) before it"
                forecasts.record_forecast(
                    db, job=late, kind=START_TIME, source=SCHEDULER, predicted=None, note=note, made_at=now
                )
            return made
        _first_forecasts(db, job, new[job.id], projector, estimator, now)
    return len(jobs)


def _first_forecasts(
    db: Session, job: Job, p: PendingJob, projector: StartProjector, estimator: Estimator, now: datetime
) -> None:
    said = why.expected_start(db, job, lambda _db, queued, _now: projector.forecast(queued.id), now)
    record = partial(forecasts.record_forecast, db, job=job, made_at=now)
    record(
        kind=START_TIME,
        source=SCHEDULER,
        predicted=_after(said.earliest, now),
        predicted_high=_after(said.latest, now),
        note=said.basis,
    )
    # The run time the policy plans with (its time limit scaled by the team's use of its limits, the team's
    # history, or 4 h), on the GPUs (CPU slots) the usage records will count.
    runtime_s = estimator.remaining_s(p.team_id, p.estimated_runtime_s, p.attained_s)
    record(
        kind=GPU_HOURS,
        source=SCHEDULER,
        predicted=runtime_s * (p.gpus or p.cpu_slots) / 3600.0,
        note=f"the scheduler's expected run time, {runtime_s:.0f} s",
    )
    forecasts.record_estimate(db, job=job, made_at=now)
    if p.memory_bytes:  # the predictor's figure at submit (the trainer's replaces it on the job once it runs)
        record(
            kind=PEAK_MEMORY,
            source=SUBMIT,
            predicted=float(p.memory_bytes),
            note="predicted at submit",
            made_at=job.submitted_at,
        )


def _after(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else max(0.0, (at - now).total_seconds())
