"""Rows the scheduler's integration tests need: teams, quotas, hosts with GPUs, jobs (inserted directly)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import GPU, Attempt, Host, Job, QosClass, Team, TeamQuota, Usage
from core.states import JobState
from core.transitions import transition

GIB = 2**30


def qos(db: Session, name: str) -> QosClass:
    q = db.scalars(select(QosClass).where(QosClass.name == name)).first()
    if q is None:  # SQLite built from the models has no seed migration
        prio = {"gold": 1000, "silver": 500, "bronze": 200, "best-effort": 0}[name]
        q = QosClass(name=name, priority=prio, preemptible=name in ("bronze", "best-effort"))
        db.add(q)
        db.flush()
    return q


def team(
    db: Session,
    name: str,
    *,
    cohort: str | None = None,
    quotas: dict[str, tuple[int, int | None, int | None]] | None = None,
    budget: float | None = None,
    created_at: datetime | None = None,
) -> Team:
    t = Team(name=name, cohort=cohort, gpu_hour_budget=budget)
    if created_at is not None:
        t.created_at = created_at
    db.add(t)
    db.flush()
    for gpu_type, (nominal, borrow, lend) in (quotas or {}).items():
        db.add(TeamQuota(team_id=t.id, gpu_type=gpu_type, nominal=nominal, borrowing_limit=borrow, lending_limit=lend))
    db.flush()
    db.refresh(t)
    return t


def host(db: Session, name: str, gpus: int, *, now: datetime, model: str = "H100", cpu_slots: int = 0) -> Host:
    h = Host(name=name, queue=f"host.{name}", state="UP", cpu_slots=cpu_slots, last_heartbeat_at=now, links={})
    db.add(h)
    db.flush()
    uuids = [f"GPU-{name}-{i}" for i in range(gpus)]
    for i, u in enumerate(uuids):
        db.add(
            GPU(
                host_id=h.id,
                uuid=u,
                index=i,
                model=model,
                memory_bytes=80 * GIB,
                nvlink_peers=[p for p in uuids if p != u],
            )
        )
    db.flush()
    return h


def job(
    db: Session,
    t: Team,
    q: QosClass,
    *,
    gpus: int,
    name: str = "job",
    submitted_at: datetime,
    time_limit_s: float | None = None,
) -> Job:
    spec: dict[str, object] = {
        "name": name,
        "team": t.name,
        "recipe": {"name": "gpt"},
        "resources": {"gpus": gpus, "cpu_slots": 1},
    }
    if time_limit_s is not None:
        spec["time_limit_s"] = time_limit_s
    j = Job(
        name=name,
        team_id=t.id,
        spec=spec,
        state="QUEUED",
        qos_class_id=q.id,
        gpus=gpus,
        submitted_at=submitted_at,
        updated_at=submitted_at,
    )
    db.add(j)
    db.flush()
    return j


def start(db: Session, j: Job, *, now: datetime) -> Attempt:
    """The worker's side: the admitted attempt starts running (and its usage is recorded)."""
    attempt = db.scalars(select(Attempt).where(Attempt.job_id == j.id, Attempt.fencing_token == j.fencing_token)).one()
    attempt.state = "RUNNING"
    attempt.started_at = now
    attempt.lease_expires_at = now + timedelta(hours=1)
    attempt.heartbeat_at = now
    transition(db, j, JobState.RUNNING)
    gpus = sum(len(p.get("gpus") or []) for p in attempt.placement) or j.gpus
    db.add(Usage(team_id=j.team_id, job_id=j.id, attempt_id=attempt.id, gpu_type="H100", gpus=gpus, started_at=now))
    db.flush()
    return attempt


def requeue_preempted(db: Session, j: Job, *, now: datetime, step: int) -> None:
    """The worker's side of a preemption: the trainer checkpointed at ``step`` and exited; requeue it."""
    attempt = db.scalars(select(Attempt).where(Attempt.job_id == j.id, Attempt.fencing_token == j.fencing_token)).one()
    attempt.state = "PREEMPTED"
    attempt.ended_at = now
    for u in db.scalars(select(Usage).where(Usage.attempt_id == attempt.id)):
        u.ended_at = now
        u.gpu_seconds = u.gpus * (now - u.started_at).total_seconds()
    j.last_step = step
    j.preempt_requested = False
    transition(db, j, JobState.QUEUED, message=f"preempted; progress kept at step {step}", now=now)
    db.flush()
