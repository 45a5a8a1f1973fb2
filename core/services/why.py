"""What would unblock a waiting job: ``kiln why`` and ``GET /v1/jobs/{id}/why``.

The scheduler says why a job waits (its pending reason, Slurm's REASON); this turns that reason into the changes
that would let it start, from what the cluster and the team have now: fewer GPUs, another GPU type or QoS class,
the team's quota, a dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import GPU, Job, QosClass, TeamQuota
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.states import ACTIVE, JobState, Reason


@dataclass(frozen=True)
class Why:
    job: Job
    unblock: list[str]  # what would let it start, most direct first; empty when nothing is known to help


def explain(*, db: Session, job: Job) -> Why:
    if job.state != JobState.QUEUED or not job.pending_reason:
        return Why(job, [])
    reason, team = job.pending_reason, teams_repo.get_by_id(db, job.team_id)
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
        deps = ", ".join(str(d) for d in jobs_repo.dependency_ids(db, job.id))
        hints = [f"job(s) {deps} must succeed first (kiln describe shows where they stand)"]
    elif reason == Reason.BUDGET:
        hints = [f"the team's GPU-hour budget: an admin raises it (kiln teams show {team_name}), or the next "
                 "budget period begins"]  # fmt: skip
    elif reason == Reason.BANDWIDTH_QUOTA:
        hints = ["a QoS class with a lower interconnect-bandwidth quota (kiln qos), or fewer GPUs per host"]
    return Why(job, hints)


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
        names = [q.name for q in classes if q.name in allowed and (q.gpu_memory_cap_bytes or wanted) >= wanted]
        return [f"a class whose memory cap fits: {', '.join(names)} (sla.qos)"] if names else []
    names = [q.name for q in classes if q.name in allowed and q.priority > job.priority]
    return [f"a higher QoS class the team {team} may use: {', '.join(names)} (sla.qos)"] if names else []
