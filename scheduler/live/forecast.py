"""A queued job's expected start, from the live snapshot and the scheduler's own ``plan()`` run forward.

Two scenarios bound it (``scheduler.simulate.projection``):

* **earliest**: each running job ends as its measured progress says (steps left at its measured step rate), else
  as the policy itself expects (its time limit scaled by the team's use of its limits, or the team's history);
* **latest**: each running job ends at its time limit plus the scheduler's grace before its kill, or, measured,
  its steps left at its rate slowed by ``projection.PACE_SLACK``, never past its limit. A job with neither a time
  limit nor measured progress has no latest end: if the job waits on it, the start cannot be known, and is not given.

Both are ``projection.scenarios``, pure, so the trace replay can measure the same forecast.

The jobs admitted on the way run for the same estimates of their own. ``kiln why``, ``kiln describe``, the job's
``/why`` and the dashboard all show this one computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from core.models import Attempt, Job, QosClass
from core.policy_config import PolicyConfig
from core.repositories import jobs as jobs_repo
from core.services.estimate_queue import WouldBe
from core.services.why import StartForecast
from scheduler.live.loader import load_snapshot, pending_job
from scheduler.policy.snapshot import PendingJob, Snapshot
from scheduler.simulate.projection import HORIZON_S, MAX_EVENTS, Start, project, scenarios

INF = math.inf
# The time each scenario may take: the why endpoint is interactive (docs/scheduler.md, "Expected start").
BUDGET_S = 0.5


def forecast_start(db: Session, job: Job, *, now: datetime, policy: PolicyConfig) -> StartForecast:
    """When and where ``job`` (queued) would start as the queue stands, or why that cannot be known."""
    snapshot = load_snapshot(db=db, now=now, half_life_s=policy.fairshare_half_life_s)
    return StartProjector(snapshot, measured_rates(db, now), policy).forecast(job.id)


def would_be_projector(db: Session, *, now: datetime, policy: PolicyConfig) -> Callable[[WouldBe], StartForecast]:
    """When and where a job not yet submitted (an option ``kiln estimate`` weighs) would start, were it submitted now:
    the live snapshot with it added to the queue under an id above all of the snapshot's, as the newest submission.
    The snapshot and the running jobs' measured rates are read once, for every option the estimate projects (each
    added alone)."""
    snapshot = load_snapshot(db=db, now=now, half_life_s=policy.fairshare_half_life_s)
    rates = measured_rates(db, now)
    job_id = 1 + max([*(p.id for p in snapshot.pending), *(r.id for r in snapshot.running)], default=0)

    def forecast(would: WouldBe) -> StartForecast:
        pending = _would_be_pending(db, would, job_id, snapshot, now)
        return StartProjector(replace(snapshot, pending=(*snapshot.pending, pending)), rates, policy).forecast(job_id)

    return forecast


def _would_be_pending(db: Session, would: WouldBe, job_id: int, snapshot: Snapshot, now: datetime) -> PendingJob:
    """The job as ``scheduler.live.loader`` would load it once submitted (its contract's terms aside: the spec's)."""
    spec = would.spec
    q = db.get(QosClass, would.qos_class_id) if would.qos_class_id is not None else None
    gpus = spec.resources.gpus
    return pending_job(
        job_id=job_id,
        team_id=would.team_id,
        team=next((t for t in snapshot.teams if t.id == would.team_id), None),
        q=q,
        spec=spec.model_dump(mode="json"),
        gpus=gpus,
        gpu_type=spec.resources.gpu_type if gpus else None,
        submitted_at=now.timestamp(),
        priority=would.priority,
        max_queue_wait_s=spec.sla.max_queue_wait_s or (q.default_max_queue_wait_s if q is not None else None),
        deadline=datetime.fromisoformat(spec.sla.deadline).timestamp() if spec.sla.deadline else None,
        estimated_runtime_s=spec.time_limit_s,
        memory_bytes=would.memory_bytes,
    )


class StartProjector:
    """Forecasts for the pending jobs of one snapshot, its two scenarios computed once: the scheduler's pass
    forecasts each newly queued job of its own snapshot (``scheduler.live.forecast_record``)."""

    def __init__(self, snapshot: Snapshot, rates: dict[int, tuple[float, float]], policy: PolicyConfig) -> None:
        self.snapshot, self.policy, self.measured = snapshot, policy, bool(rates)
        self.scenarios = scenarios(snapshot, rates, policy.time_limit_grace_s)
        self.running = {r.id for r in snapshot.running}

    def forecast(self, job_id: int) -> StartForecast:
        first, last = (
            project(
                self.snapshot, self.policy, job_id, ends, horizon_s=HORIZON_S, max_events=MAX_EVENTS, budget_s=BUDGET_S
            )
            for ends in self.scenarios
        )
        return _said(first, last, measured=self.measured, running=self.running)


def measured_rates(db: Session, now: datetime) -> dict[int, tuple[float, float]]:
    """Running job -> (steps left, steps per second of its current attempt), where it has trained a step."""
    out: dict[int, tuple[float, float]] = {}
    for job, attempt in jobs_repo.active_jobs(db):
        rate = _rate(job, attempt, now)
        if rate is not None:
            total = int((job.spec or {}).get("steps") or 0)
            out[job.id] = (max(0.0, total - job.last_step), rate)
    return out


def _rate(job: Job, attempt: Attempt | None, now: datetime) -> float | None:
    if attempt is None or attempt.first_step_at is None or attempt.ended_at is not None:
        return None
    done = job.last_step - (attempt.resumed_from_step or 0)
    seen = (attempt.heartbeat_at or now) - attempt.first_step_at
    return done / seen.total_seconds() if done > 0 and seen.total_seconds() > 0 else None


def _said(first: Start, last: Start, *, measured: bool, running: set[int]) -> StartForecast:
    if first.stopped == "absent":
        return StartForecast(None, None, (), "not in the scheduler's plan (held, or no longer queued)")
    if last.at is None or first.failed:
        return StartForecast(None, None, (), f"cannot be known: {_why_not(first if first.failed else last, running)}")
    at = first.at if first.at is not None else last.at  # plan()'s choices may differ between the scenarios
    how = "measured progress where known, else " if measured else ""
    basis = (
        f"the scheduler's plan run forward: running jobs end by {how}their time limits (earliest: as kiln expects "
        "them to use their limits; latest: at their limits); jobs submitted later with a higher priority go first"
    )
    return StartForecast(_dt(min(at, last.at)), _dt(max(at, last.at)), first.hosts or last.hosts, basis)


def _why_not(start: Start, running: set[int]) -> str:
    if start.stopped == "unknown":
        now = [str(j) for j in start.waits_on if j in running]
        ahead = [str(j) for j in start.waits_on if j not in running]
        who = " and ".join(
            [
                *([f"running job(s) {', '.join(now)}"] if now else []),
                *([f"job(s) {', '.join(ahead)} ahead of it in the queue"] if ahead else []),
            ]
        )
        return (
            f"it starts only after {who} end, which have no time limit (time_limit_s) and report no progress "
            "yet; kiln does not guess how long a job runs"
        )
    if start.stopped == "failed":
        return f"the scheduler would fail it: {start.failed}"
    if start.stopped == "drained":
        return "it does not start even once every running job has ended (its pending reason says what holds it)"
    return (
        f"it does not start within the next {start.events} ends of running jobs (or {HORIZON_S / 86400:.0f} "
        "days) of the queue as it stands"
    )


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
