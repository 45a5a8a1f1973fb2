"""What would unblock a waiting job: ``kiln why`` and ``GET /v1/jobs/{id}/why``.

The scheduler says why a job waits (its pending reason, Slurm's REASON); this turns that reason into the changes
that would let it start, from what the cluster and the team have now: fewer GPUs, another GPU type or QoS class,
the team's quota, a dependency; and when it can be known honestly, the expected start.

The expected start is a bound, never a guess: each running job ends at the latest at its time limit (plus the
scheduler's grace before its kill), so once enough of them have reached theirs the capacity the job needs is free.
A running job without a time limit may run for ever: then no start can be promised, and the answer says which
jobs those are. How long jobs happened to run before is never used.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import GPU, Host, Job, QosClass, TeamQuota
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.states import ACTIVE, HostState, JobState, Reason


@dataclass(frozen=True)
class Why:
    job: Job
    unblock: list[str]  # what would let it start, most direct first; empty when nothing is known to help
    expected_start: datetime | None = None  # at the latest then (see the module's doc); None: cannot be known
    expected_start_basis: str | None = None  # how the expected start is known, or why it cannot be


def explain(*, db: Session, job: Job, grace_s: float = 0.0, now: datetime | None = None) -> Why:
    """``grace_s``: how long past a time limit the scheduler waits before its kill (KILN_POLICY__TIME_LIMIT_GRACE_S)."""
    if job.state != JobState.QUEUED:
        return Why(job, [])
    at, basis = expected_start(db, job, grace_s=grace_s, now=now or utcnow())
    if not job.pending_reason:
        return Why(job, [], at, basis)
    hints = _hints(db, job)
    return Why(job, hints, at, basis)


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
        hints = ["less memory per GPU: a lower batch_size, or parallelism: fsdp over more GPUs",
                 *_class_hints(db, job, team_name, need_memory=True)]  # fmt: skip
    elif reason == Reason.DEPENDENCY:
        deps = ", ".join(str(d) for d, _ in jobs_repo.dependencies(db, job.id))
        hints = [f"job(s) {deps} must succeed first (kiln describe shows where they stand)"]
    elif reason == Reason.BUDGET:
        hints = [f"the team's GPU-hour budget: an admin raises it (kiln teams show {team_name}), or the next "
                 "budget period begins"]  # fmt: skip
    elif reason == Reason.HELD:
        hints = [f"release it: kiln release {job.id} (it was {job.pending_message or 'held'})"]
    elif reason == Reason.BANDWIDTH_QUOTA:
        hints = ["a QoS class with a lower interconnect-bandwidth quota (kiln qos), or fewer GPUs per host"]
    return hints


# Reasons for which the start depends on something no clock bounds, and what that is.
_UNKNOWABLE: dict[str, str] = {
    Reason.UNSCHEDULABLE: "no host as the cluster is now can ever run it (see what would let it start)",
    Reason.DEPENDENCY: "it waits for other jobs to end as it requires, and whether they succeed cannot be known",
    Reason.QUOTA: "it waits for the team's quota, which frees as the team's own jobs end or an admin raises it",
    Reason.BUDGET: "it waits for the team's GPU-hour budget (the next period, or an admin raising it)",
    Reason.PRIORITY: "the capacity it could use is held for a higher-priority job, and more of those may come",
    Reason.SWEEP_LIMIT: "its sweep runs as many jobs as its max_concurrent allows; it starts as one of them ends",
    Reason.BANDWIDTH_QUOTA: "it waits for the class's interconnect-bandwidth quota",
    Reason.MEMORY_FIT: "no GPU has the memory it needs free: it depends on what shares them",
    Reason.HELD: "it is held: it starts only after it is released",
}


def expected_start(db: Session, job: Job, *, grace_s: float, now: datetime) -> tuple[datetime | None, str]:
    """When a queued job can start at the latest, from the running jobs' time limits, or why that cannot be known."""
    reason = job.pending_reason
    if reason is None:
        return None, "not planned yet: the scheduler looks at it within a few seconds"
    if reason in _UNKNOWABLE:
        return None, f"cannot be known: {_UNKNOWABLE[reason]}"
    if job.not_before is not None and job.not_before > now:
        return job.not_before, "its restart backoff ends then (it may start then if capacity is free)"
    if reason not in (Reason.RESOURCES, Reason.RESERVATION):  # back in the queue (Backoff, Preempted, Drained)
        return None, "not planned again yet: the scheduler looks at it within a few seconds"
    need = job.gpus or _cpu_slots(job)
    unit = f"{job.gpu_type} GPU" if job.gpus and job.gpu_type else "GPU" if job.gpus else "CPU slot"
    total = _capacity(db, job)
    running = _running_on_same(db, job)
    free = total - sum(units for _id, units, _end in running)
    if need > total:
        return None, f"cannot be known: it needs {_n(need, unit)} and the hosts up have {total}"
    ahead = ("the scheduler holds that capacity for it" if reason == Reason.RESERVATION
             else "unless a job ahead of it takes that capacity first")  # fmt: skip
    if free >= need:
        return None, (f"cannot be known: {_n(free, unit)} free, but not in the shape it needs (per host, links or "
                      "memory); it starts when running jobs end")  # fmt: skip
    known = sorted((end, jid, units) for jid, units, end in running if end is not None)
    freed = 0
    for end, _jid, units in known:
        freed += units
        if free + freed >= need:
            at = max(end + timedelta(seconds=grace_s), now)
            ended = [str(i) for _e, i, _u in known if _e <= end]
            return at, (f"at the latest: {_n(need, unit)} free once running job(s) {', '.join(ended)} reach their "
                        f"time limits; {ahead}")  # fmt: skip
    unbounded = sorted(jid for jid, _units, end in running if end is None)
    return None, (f"cannot be known: running job(s) {', '.join(map(str, unbounded))} have no time limit "
                  "(time_limit_s), and kiln does not guess how long a job runs")  # fmt: skip


def _n(count: int, unit: str) -> str:
    return f"{count} {unit}" + ("" if count == 1 else "s")


def _cpu_slots(job: Job) -> int:
    return int((job.spec.get("resources") or {}).get("cpu_slots") or 1)


def _capacity(db: Session, job: Job) -> int:
    up = select(Host.id).where(Host.state == HostState.UP.value)
    if not job.gpus:
        return int(db.scalar(select(func.coalesce(func.sum(Host.cpu_slots), 0)).where(Host.id.in_(up))) or 0)
    stmt = select(func.count()).select_from(GPU).where(GPU.host_id.in_(up), GPU.healthy.is_(True))
    if job.gpu_type is not None:
        stmt = stmt.where(GPU.model == job.gpu_type)
    return int(db.scalar(stmt) or 0)


def _running_on_same(db: Session, job: Job) -> list[tuple[int, int, datetime | None]]:
    """(id, units, end at its time limit or None) of the active jobs that hold what ``job`` needs: the scheduler's
    own reading of a running job's end (its current attempt's start plus the spec's time limit)."""
    rows = []
    for other, attempt in jobs_repo.active_jobs(db):
        same_kind = other.gpus > 0 if job.gpus else other.gpus == 0
        if other.id == job.id or not same_kind or (job.gpus and job.gpu_type and other.gpu_type != job.gpu_type):
            continue
        limit = other.time_limit_s
        begun = (attempt.started_at or attempt.created_at) if attempt is not None else other.admitted_at or utcnow()
        end = begun + timedelta(seconds=limit) if limit is not None else None
        rows.append((other.id, other.gpus or _cpu_slots(other), end))
    return rows


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
        hints.append(f"fewer GPUs: the whole cluster has {total} {label}" if total else
                     f"a host with {label} must join (none has registered)")  # fmt: skip
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
    running = db.scalars(select(Job).where(
        Job.team_id == job.team_id, Job.state.in_([s.value for s in ACTIVE]), Job.gpu_type == job.gpu_type
    ))  # fmt: skip
    used = sum(j.gpus or int((j.spec.get("resources") or {}).get("cpu_slots") or 1) for j in running)
    unit = "CPU slots" if key == "cpu" else f"{key} GPUs"
    hints = [f"the team's quota: {team} uses {used} of its {nominal} {unit}; an admin raises it "
             f"(kiln teams set {team} --quota {key}=N), or its running jobs end"]  # fmt: skip
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
