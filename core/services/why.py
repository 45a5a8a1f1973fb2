"""What would unblock a waiting job: ``kiln why`` and ``GET /v1/jobs/{id}/why``.

The scheduler says why a job waits (its pending reason, Slurm's REASON); this turns that reason into the changes
that would let it start, from what the cluster and the team have now: fewer GPUs, another GPU type or QoS class,
the team's quota, a dependency; and the expected start.

The expected start is the scheduler's own: its ``plan()`` run forward from the live snapshot as running jobs end,
earliest and latest (``scheduler.live.forecast``, handed in by the API's composition root as ``forecaster``, since
``core`` imports no scheduler). It is one answer: a range of times with where the job would start, or "cannot be
known" with the reason, never both. Reasons no clock bounds (a dependency's outcome, a budget period, a hold, a
cluster too small) are said without running the projection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import GPU, Job, QosClass, TeamQuota
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.states import ACTIVE, JobState, Reason


@dataclass(frozen=True)
class StartForecast:
    earliest: datetime | None  # None: cannot be known (``basis`` says why)
    latest: datetime | None
    hosts: tuple[str, ...]  # where it would start (the earliest scenario's placement)
    basis: str  # how it is known, or why it cannot be


# (session, the queued job, now) -> its forecast: scheduler.live.forecast.forecast_start with the policy bound
Forecaster = Callable[[Session, Job, datetime], StartForecast]


@dataclass(frozen=True)
class Why:
    job: Job
    unblock: list[str]  # what would let it start, most direct first; empty when nothing is known to help
    forecast: StartForecast | None = None  # None when the job is not queued


def explain(*, db: Session, job: Job, forecaster: Forecaster | None = None, now: datetime | None = None) -> Why:
    """``forecaster``: the scheduler's projection (None: the expected start is said to be unavailable)."""
    if job.state != JobState.QUEUED:
        return Why(job, [])
    forecast = expected_start(db, job, forecaster, now or utcnow())
    return Why(job, _hints(db, job) if job.pending_reason else [], forecast)


def _hints(db: Session, job: Job) -> list[str]:
    reason = job.pending_reason
    team = teams_repo.get_by_id(db, job.team_id)
    team_name = team.name if team is not None else str(job.team_id)
    hints: list[str] = []
    if reason in (Reason.UNSCHEDULABLE, Reason.RESOURCES):
        hints = _capacity_hints(db, job, whole_cluster=reason == Reason.UNSCHEDULABLE)
    elif reason == Reason.QUOTA:
        hints = _quota_hints(db, job, team_name)
    elif reason in (Reason.PRIORITY, Reason.RESERVATION):
        hints = _class_hints(db, job, team_name)
        hints.append("it starts when the capacity held for another job frees (a running job ends or is preempted)")
    elif reason == Reason.MEMORY_FIT:
        hints = [
            "less memory per GPU: a lower batch_size, or parallelism: fsdp over more GPUs",
            *_class_hints(db, job, team_name, need_memory=True),
        ]
    elif reason == Reason.DEPENDENCY:
        deps = ", ".join(str(d) for d, _ in jobs_repo.dependencies(db, job.id))
        hints = [f"job(s) {deps} must succeed first (kiln describe shows where they stand)"]
    elif reason == Reason.BUDGET:
        hints = [
            f"the team's GPU-hour budget: an admin raises it (kiln teams show {team_name}), or the next "
            "budget period begins"
        ]
    elif reason == Reason.HELD:
        hints = [f"release it: kiln release {job.id} (it was {job.pending_message or 'held'})"]
    elif reason == Reason.BANDWIDTH_QUOTA:
        hints = ["a QoS class with a lower interconnect-bandwidth quota (kiln qos), or fewer GPUs per host"]
    return hints


# Reasons for which the start depends on something no clock bounds, and what that is. The others (Resources,
# Reservation, Priority, Quota, MemoryFit, BandwidthQuota, a sweep's limit, a backoff) free as running jobs end:
# the projection answers them.
_UNKNOWABLE: dict[str, str] = {
    Reason.UNSCHEDULABLE: "no host as the cluster is now can ever run it (see what would let it start)",
    Reason.DEPENDENCY: "it waits for other jobs to end as it requires, and whether they succeed cannot be known",
    Reason.BUDGET: "it waits for the team's GPU-hour budget (the next period, or an admin raising it)",
    Reason.HELD: "it is held: it starts only after it is released",
}


def expected_start(db: Session, job: Job, forecaster: Forecaster | None, now: datetime) -> StartForecast:
    """One answer for a queued job: the scheduler's projection, or why no start can be promised."""
    reason = job.pending_reason
    if reason in _UNKNOWABLE:
        return StartForecast(None, None, (), f"cannot be known: {_UNKNOWABLE[reason]}")
    if forecaster is None:
        return StartForecast(None, None, (), "cannot be known: this server does not run the scheduler's projection")
    return forecaster(db, job, now)


def _gpu_counts(db: Session) -> dict[str, int]:
    rows = db.execute(select(GPU.model, func.count()).group_by(GPU.model)).tuples()
    return {model: int(n) for model, n in rows}


def _in_use(db: Session, gpu_type: str | None) -> int:
    stmt = select(func.coalesce(func.sum(Job.gpus), 0)).where(Job.state.in_([s.value for s in ACTIVE]))
    if gpu_type is not None:
        stmt = stmt.where(Job.gpu_type == gpu_type)
    return int(db.scalar(stmt) or 0)


def _capacity_hints(db: Session, job: Job, *, whole_cluster: bool) -> list[str]:
    if not job.gpus:
        return ["fewer CPU slots (resources.cpu_slots)" + ("" if not whole_cluster else ": no host has as many")]
    counts = _gpu_counts(db)
    kind = job.gpu_type
    total = counts.get(kind, 0) if kind else sum(counts.values())
    label = f"{kind} GPUs" if kind else "GPUs"
    hints: list[str] = []
    if whole_cluster:
        hints.append(
            f"fewer GPUs: the whole cluster has {total} {label}"
            if total
            else f"a host with {label} must join (none has registered)"
        )
    else:
        free = max(total - _in_use(db, kind), 0)
        hints.append(f"fewer GPUs: {free} of the cluster's {total} {label} are free now")
    others = sorted((n, t) for t, n in counts.items() if t != kind and n >= job.gpus)
    if kind and others:
        hints.append("another GPU type: " + ", ".join(f"{t} ({n} in the cluster)" for n, t in reversed(others)))
    return hints


def _quota_hints(db: Session, job: Job, team: str) -> list[str]:
    key = "cpu" if not job.gpus else (job.gpu_type or "*")
    quotas = db.scalars(select(TeamQuota).where(TeamQuota.team_id == job.team_id, TeamQuota.gpu_type.in_([key, "*"])))
    nominal = sum(q.nominal for q in quotas)
    running = db.scalars(
        select(Job).where(
            Job.team_id == job.team_id, Job.state.in_([s.value for s in ACTIVE]), Job.gpu_type == job.gpu_type
        )
    )
    used = sum(j.gpus or int((j.spec.get("resources") or {}).get("cpu_slots") or 1) for j in running)
    unit = "CPU slots" if key == "cpu" else f"{key} GPUs"
    hints = [
        f"the team's quota: {team} uses {used} of its {nominal} {unit}; an admin raises it "
        f"(kiln teams set {team} --quota {key}=N), or its running jobs end"
    ]
    if job.gpus and nominal - used > 0:
        hints.insert(0, f"fewer GPUs: {nominal - used} fit in the team's quota now")
    return hints


def _class_hints(db: Session, job: Job, team: str, *, need_memory: bool = False) -> list[str]:
    """The team's other classes that rank above the job's (or, for memory, whose cap fits)."""
    allowed = set(teams_repo.allowed_qos_names(db, job.team_id))
    classes = db.scalars(select(QosClass).order_by(QosClass.priority.desc())).all()
    if need_memory:
        wanted = job.predicted_memory_bytes or 0
        fits = [q for q in classes if (q.gpu_memory_cap_bytes or wanted) >= wanted]
        if any(q.id == job.qos_class_id for q in fits):
            return []  # its own class's cap is not what stops it: the GPUs are too small, another class won't help
        names = [q.name for q in fits if q.name in allowed]
        return [f"a class whose memory cap fits: {', '.join(names)} (sla.qos)"] if names else []
    names = [q.name for q in classes if q.name in allowed and q.priority > job.priority]
    return [f"a higher QoS class the team {team} may use: {', '.join(names)} (sla.qos)"] if names else []
