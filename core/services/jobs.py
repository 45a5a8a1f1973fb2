"""Jobs: submission (spec -> QUEUED job + effective contract + SUBMITTED event), reading, cancelling."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from core.models import Attempt, Checkpoint, Event, Job, JobDependency, JobMetric, Role, SlaContract
from core.notify import notify_jobs_changed
from core.repositories import jobs as jobs_repo
from core.repositories import qos as qos_repo
from core.repositories import teams as teams_repo
from core.repositories.jobs import JobFilter
from core.services.errors import Conflict, InvalidInput, NotFound
from core.services.principal import Principal, require_team
from core.services.sla import DEFAULT_QOS, default_contract, effective_terms
from core.spec import JobSpec
from core.states import TERMINAL, JobState, record_event, transition


@dataclass(frozen=True)
class JobView:
    """A job with the names a reader wants instead of ids."""

    job: Job
    team: str
    user: str | None
    qos: str


@dataclass(frozen=True)
class JobPage:
    items: list[JobView]
    next_before_id: int | None


def submit(*, db: Session, principal: Principal, spec: JobSpec) -> JobView:
    team = require_team(principal, teams_repo.get_by_name(db, spec.team), spec.team, Role.MEMBER)
    base = default_contract(db=db, team=team)
    qos_name = spec.sla.qos or (base.qos_class.name if base.qos_class is not None else DEFAULT_QOS)
    qos = qos_repo.get_by_name(db, qos_name)
    if qos is None:
        loc = "sla.qos" if spec.sla.qos else "team.sla.qos"
        raise InvalidInput.at(loc, f"unknown QoS class {qos_name!r}")
    depends_on = _dependencies(db, team_id=team.id, team=team.name, refs=spec.depends_on)

    job = Job(
        name=spec.name,
        team_id=team.id,
        user_id=principal.user_id,
        spec=spec.model_dump(mode="json"),
        state=JobState.QUEUED.value,
        qos_class_id=qos.id,
        priority=qos.priority,
        gpus=spec.resources.gpus,
        gpu_type=spec.resources.gpu_type if spec.resources.gpus else "cpu",
    )
    db.add(job)
    db.flush()
    db.add_all(JobDependency(job_id=job.id, depends_on_id=dep) for dep in depends_on)
    db.add(
        SlaContract(
            team_id=team.id, job_id=job.id, qos_class_id=qos.id, **effective_terms(base=base, overrides=spec.sla)
        )
    )
    record_event(
        db, "SUBMITTED", job=job, actor_user_id=principal.user_id,
        message=f"submitted by {principal.name} (qos {qos.name}, priority {qos.priority})",
        data={"qos": qos.name, "priority": qos.priority, "gpus": job.gpus, "depends_on": depends_on},
    )  # fmt: skip
    notify_jobs_changed(db, str(job.id))
    return JobView(job=job, team=team.name, user=principal.name, qos=qos.name)


def _dependencies(db: Session, *, team_id: int, team: str, refs: Sequence[str]) -> list[int]:
    ids: list[int] = []
    for i, ref in enumerate(refs):
        if not ref.isdigit() or len(ref) > 18:
            raise InvalidInput.at(f"depends_on.{i}", f"{ref!r} is not a job id")
        ids.append(int(ref))
    found = jobs_repo.existing_ids_in_team(db, team_id=team_id, job_ids=ids)
    for i, dep in enumerate(ids):
        if dep not in found:
            raise InvalidInput.at(f"depends_on.{i}", f"no job {dep} in team {team!r}")
    return sorted(set(ids))


def _visible(db: Session, principal: Principal, job_id: int, *, for_update: bool = False) -> Job:
    job = jobs_repo.get(db, job_id, for_update=for_update)
    if job is None or not principal.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    return job


def get(*, db: Session, principal: Principal, job_id: int) -> JobView:
    row = jobs_repo.get_row(db, job_id)
    if row is None or not principal.can_see(row[0].team_id):
        raise NotFound(f"job {job_id} not found")
    return JobView(*row)


def list_jobs(
    *,
    db: Session,
    principal: Principal,
    team: str | None = None,
    states: Sequence[str] = (),
    qos: str | None = None,
    name: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
) -> JobPage:
    team_id = None
    if team is not None:
        team_id = require_team(principal, teams_repo.get_by_name(db, team), team).id
    unknown = sorted(set(states) - {s.value for s in JobState})
    if unknown:
        raise InvalidInput.at("state", f"unknown states {unknown}")
    qos_id = None
    if qos is not None:
        q = qos_repo.get_by_name(db, qos)
        if q is None:
            raise InvalidInput.at("qos", f"unknown QoS class {qos!r}")
        qos_id = q.id
    flt = JobFilter(
        team_ids=principal.visible_team_ids(), team_id=team_id, states=tuple(states), qos_id=qos_id, name=name,
        before_id=before_id,
    )  # fmt: skip
    rows = jobs_repo.list_rows(db, flt, limit + 1)
    items = [JobView(*r) for r in rows[:limit]]
    return JobPage(items=items, next_before_id=items[-1].job.id if len(rows) > limit else None)


def cancel(*, db: Session, principal: Principal, job_id: int, reason: str | None = None) -> JobView:
    """QUEUED (or LOST) jobs are cancelled at once; running ones get ``cancel_requested`` for the worker."""
    job = _visible(db, principal, job_id, for_update=True)
    team = teams_repo.get_by_id(db, job.team_id)
    assert team is not None
    require_team(principal, team, team.name, Role.MEMBER)
    state = JobState(job.state)
    why = f"cancelled by {principal.name}" + (f": {reason}" if reason else "")
    if state in TERMINAL:
        raise Conflict(f"job {job_id} already finished ({state.value})")
    if state in (JobState.QUEUED, JobState.LOST):
        transition(db, job, JobState.CANCELLED, message=why, data={"reason": reason}, actor_user_id=principal.user_id)
        job.cancel_requested = True
    elif not job.cancel_requested:
        job.cancel_requested = True
        record_event(
            db, "CANCEL_REQUESTED", job=job, actor_user_id=principal.user_id,
            message=f"{why} (while {state.value}; the worker stops it)", data={"reason": reason},
        )  # fmt: skip
    db.flush()
    notify_jobs_changed(db, str(job_id))
    return get(db=db, principal=principal, job_id=job_id)


def events(
    *, db: Session, principal: Principal, job_id: int, after_id: int = 0, limit: int = 100
) -> list[tuple[Event, str | None]]:
    _visible(db, principal, job_id)
    return list(jobs_repo.events(db, job_id=job_id, after_id=after_id, limit=limit))


def attempts(*, db: Session, principal: Principal, job_id: int) -> Sequence[Attempt]:
    _visible(db, principal, job_id)
    return jobs_repo.attempts(db, job_id)


def checkpoints(*, db: Session, principal: Principal, job_id: int) -> Sequence[Checkpoint]:
    _visible(db, principal, job_id)
    return jobs_repo.checkpoints(db, job_id)


def metrics(
    *, db: Session, principal: Principal, job_id: int, after_step: int = -1, max_points: int = 1000
) -> Sequence[JobMetric]:
    _visible(db, principal, job_id)
    return jobs_repo.metrics(db, job_id=job_id, after_step=after_step, max_points=max_points)


def why(*, db: Session, principal: Principal, job_id: int) -> Job:
    return _visible(db, principal, job_id)


@dataclass(frozen=True)
class LogTarget:
    job_id: int
    attempt: int | None  # None: no attempt yet
    path: Path | None
    state: str


def log_target(
    *, db: Session, principal: Principal, job_id: int, storage_dir: Path, attempt: int | None = None
) -> LogTarget:
    """Where the attempt's log lives: ``storage/logs/<job>/<attempt>.log`` (the latest attempt by default)."""
    job = _visible(db, principal, job_id)
    number = attempt if attempt is not None else jobs_repo.latest_attempt_number(db, job_id)
    path = None if number is None else storage_dir / "logs" / str(job_id) / f"{number}.log"
    return LogTarget(job_id=job_id, attempt=number, path=path, state=job.state)


def is_terminal(*, db: Session, job_id: int) -> bool:
    job = jobs_repo.get(db, job_id)
    return job is None or JobState(job.state) in TERMINAL
