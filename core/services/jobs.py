"""Jobs: submission (spec -> QUEUED job + effective contract + SUBMITTED event), reading, changing, cancelling,
holding."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from core.db import as_utc, utcnow
from core.event_types import EventType
from core.models import Attempt, Checkpoint, Event, Job, JobMetric, QosClass, Role
from core.notify import notify_jobs_changed
from core.repositories import jobs as jobs_repo
from core.repositories import qos as qos_repo
from core.repositories import teams as teams_repo
from core.repositories.jobs import JobFilter
from core.repositories.keyset import Window
from core.services.checkpoint_advice import CheckpointAdvice, advise
from core.services.errors import Conflict, Forbidden, InvalidInput, NotFound
from core.services.fit import FitSettings, canonical_gpu_type
from core.services.job_view import JobView
from core.services.principal import Principal, require_team, require_team_id
from core.services.submission import MAX_UNFINISHED, Idempotency, checked, dependencies, submit
from core.services.why import Forecaster, Why, explain
from core.spec import JobSpec, parse_spec_data
from core.states import TERMINAL, JobState
from core.transitions import hold as hold_job
from core.transitions import record_event, transition
from core.transitions import release as release_job


@dataclass(frozen=True)
class JobPage:
    items: list[JobView]
    next_before_id: int | None
    utc: bool = True  # False: the rows' datetimes are in the database session's zone (not UTC)


def submit_once(
    *,
    db: Session,
    principal: Principal,
    spec: JobSpec,
    idempotency: Idempotency,
    hold: bool = False,
    max_unfinished: int = MAX_UNFINISHED,
    fit: FitSettings = FitSettings(),
) -> tuple[JobView, bool]:
    """A keyed submission: (the job an earlier submission with this key made in the team, True) when the request
    is the same, else (a new job, False). The same key with another request is refused: a key names one request.
    A concurrent twin loses at the unique (team, key) index: 409, and its retry finds the job."""
    team_id = require_team_id(principal, teams_repo.id_by_name(db, spec.team), spec.team, Role.MEMBER)
    job = jobs_repo.by_idempotency_key(db, team_id=team_id, key=idempotency.key)
    if job is None:
        view = submit(
            db=db,
            principal=principal,
            spec=spec,
            idempotency=idempotency,
            hold=hold,
            max_unfinished=max_unfinished,
            fit=fit,
        )
        return view, False
    if job.request_sha256 != idempotency.request_sha256:
        raise InvalidInput.at(
            "header.Idempotency-Key",
            f"already used for another request (it made job {job.id}); a retry must send the same body, a new "
            "request a new key",
            "idempotency_key_reused",
        )
    return get(db=db, principal=principal, job_id=job.id), True


def _visible(db: Session, principal: Principal, job_id: int, *, for_update: bool = False) -> Job:
    job = jobs_repo.get(db, job_id, for_update=for_update)
    if job is None or not principal.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    return job


def get(*, db: Session, principal: Principal, job_id: int) -> JobView:
    """The job, if the principal may see it (the visibility is part of the query)."""
    rows = jobs_repo.list_rows(db, JobFilter(team_ids=principal.visible_team_ids(), job_id=job_id), 1)
    if not rows:
        raise NotFound(f"job {job_id} not found")
    return JobView._make(rows[0])


@dataclass(frozen=True)
class CodeView:
    """The team's own code a job runs (spec ``code``) and the last evaluation its worker relayed."""

    team: str
    digest: str | None
    entry_point: str | None
    evaluation: dict[str, Any] | None


def code(*, db: Session, principal: Principal, job_id: int) -> CodeView:
    view = get(db=db, principal=principal, job_id=job_id)
    spec_code = (json.loads(view.spec_json) or {}).get("code") or {}
    job = jobs_repo.get(db, job_id)
    return CodeView(
        team=view.team,
        digest=spec_code.get("digest"),
        entry_point=spec_code.get("entry_point"),
        evaluation=job.eval_metrics if job is not None else None,
    )


def list_jobs(
    *,
    db: Session,
    principal: Principal,
    team: str | None = None,
    states: Sequence[str] = (),
    qos: str | None = None,
    name: str | None = None,
    user: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
    submitted_after: datetime | None = None,
    submitted_before: datetime | None = None,
    held: bool | None = None,
    sweep: int | None = None,
) -> JobPage:
    """Newest first. ``submitted_after`` (inclusive) and ``submitted_before`` (exclusive) bound the submission
    time; a time without a zone is UTC. ``sweep``: that sweep's jobs (a sweep of no visible team has none)."""
    submitted_after, submitted_before = as_utc(submitted_after), as_utc(submitted_before)
    if submitted_after is not None and submitted_before is not None and submitted_after >= submitted_before:
        raise InvalidInput.at("submitted_before", "must be later than submitted_after")
    team_id = None
    if team is not None:
        team_id = require_team_id(principal, teams_repo.id_by_name(db, team), team)
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
        team_ids=principal.visible_team_ids(),
        team_id=team_id,
        states=tuple(states),
        qos_id=qos_id,
        name=name,
        user=user,
        before_id=before_id,
        submitted_after=submitted_after,
        submitted_before=submitted_before,
        held=held,
        sweep_id=sweep,
    )
    rows = jobs_repo.list_rows(db, flt, limit + 1)
    page: Sequence[Any] = rows[:limit]
    items = [JobView._make(r) for r in page]
    utc = db.get_bind().dialect.name != "postgresql" or jobs_repo.session_is_utc(db)
    return JobPage(items=items, next_before_id=items[-1].id if len(rows) > limit else None, utc=utc)


def cancel(*, db: Session, principal: Principal, job_id: int, reason: str | None = None) -> JobView:
    """QUEUED (or LOST) jobs are cancelled at once; running ones get ``cancel_requested`` for the worker."""
    job = _changeable(db, principal, job_id)
    state = JobState(job.state)
    why = f"cancelled by {principal.name}" + (f": {reason}" if reason else "")
    if state in TERMINAL:
        raise Conflict(f"job {job_id} already finished ({state.value})")
    if state in (JobState.QUEUED, JobState.LOST):
        job.exit_reason = why[:512]
        transition(db, job, JobState.CANCELLED, message=why, data={"reason": reason}, actor_user_id=principal.user_id)
        job.cancel_requested = True
    elif not job.cancel_requested:
        job.cancel_requested = True
        job.exit_reason = why[:512]  # the CANCELLED the worker writes once it stopped says it (lifecycle.stop_cause)
        record_event(
            db,
            EventType.CANCEL_REQUESTED,
            job=job,
            actor_user_id=principal.user_id,
            message=f"{why}: stopping, checkpoint first (while {state.value})",
            data={"reason": reason},
        )
    db.flush()
    notify_jobs_changed(db, str(job_id))
    return get(db=db, principal=principal, job_id=job_id)


# A job that has not started yet or is running (an admitted one stops at its first heartbeat, a preempting one is
# on its way back to the queue).
HOLDABLE = frozenset({JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING})


def hold(*, db: Session, principal: Principal, job_id: int, reason: str | None = None) -> JobView:
    """Keep a job from starting until it is released (Slurm's ``scontrol hold``; a running one as ``scontrol
    requeuehold``: it stops, checkpoint first, and goes back to the queue held). Its wait pauses, so its queue-wait
    SLA and its age in the queue count only the time it could have started. Holding a held job changes nothing.
    Who may cancel the job may hold and release it."""
    job = _changeable(db, principal, job_id)
    if job.held_at is None:
        if job.state not in HOLDABLE or job.cancel_requested:
            raise Conflict(
                f"job {job_id} is {job.state}"
                + (" and stopping" if job.cancel_requested else "")
                + ": only a queued or running job can be held"
            )
        hold_job(
            db,
            job,
            by=principal.name,
            reason=reason,
            actor_user_id=principal.user_id,
            now=utcnow(),
            admin_role=_admin_role(principal, job.team_id),
        )
        db.flush()
        notify_jobs_changed(db, str(job_id))
    return get(db=db, principal=principal, job_id=job_id)


def release(*, db: Session, principal: Principal, job_id: int) -> JobView:
    """Let a held job start again: the scheduler plans it on its next cycle. A team admin's hold is released by a
    team admin or an admin only. Releasing a job that is not held changes nothing (a finished job is a conflict)."""
    job = _changeable(db, principal, job_id)
    if job.held_by_admin and _admin_role(principal, job.team_id) is None:
        raise Forbidden(
            f"job {job_id} was held by a team admin ({job.pending_message}): only a team admin or an admin releases it"
        )
    if job.held_at is not None:
        release_job(db, job, by=principal.name, actor_user_id=principal.user_id, now=utcnow())
        db.flush()
        notify_jobs_changed(db, str(job_id))
    elif job.state in TERMINAL:
        raise Conflict(f"job {job_id} already finished ({job.state})")
    return get(db=db, principal=principal, job_id=job_id)


UNCHANGED: Any = object()  # ``update``: a field not given


def update(
    *,
    db: Session,
    principal: Principal,
    job_id: int,
    qos: str | None = None,
    time_limit_s: Any = UNCHANGED,
    gpus: int | None = None,
    depends_on: list[str] | None = None,
    fit: FitSettings = FitSettings(),
) -> JobView:
    """Change a job's QoS class, time limit, GPU count or dependencies (Slurm's ``scontrol update``;
    ``time_limit_s=None`` removes the limit, ``depends_on=[]`` the dependencies). A QUEUED job: any, checked as a
    submission is (``_change_queued``). A running (or admitted) job: its time limit only (its class and GPUs chose
    its placement and victims: hold it, change it, release it), as Slurm allows (``_check_running_limit``); its
    worker follows the new limit at its next heartbeat."""
    if depends_on is not None:
        # Before the job's row lock: two changes at once, each checked against a graph without the other's, could
        # close a cycle together, and each holding its own job's row while inserting a reference to the other's
        # would deadlock.
        jobs_repo.lock_dependency_graph(db)
    job = _changeable(db, principal, job_id)
    old_limit = job.time_limit_s
    before: dict[str, Any] = {"qos": _qos_name(db, job), "time_limit_s": old_limit, "gpus": job.gpus}
    if depends_on is not None:
        before["depends_on"] = _dependency_refs(db, job.id)
    data = dict(job.spec)
    if qos is not None:
        data["sla"] = {**(data.get("sla") or {}), "qos": qos}
    if time_limit_s is not UNCHANGED:
        data["time_limit_s"] = time_limit_s
    if gpus is not None:
        data["resources"] = {**(data.get("resources") or {}), "gpus": gpus}
    if depends_on is not None:
        data["depends_on"] = depends_on
    spec = canonical_gpu_type(parse_spec_data(data))
    running = job.state in (JobState.ADMITTED, JobState.RUNNING)
    after: dict[str, Any] = {}
    if job.state == JobState.QUEUED:
        after["depends_on"] = _change_queued(
            db, principal, job, spec, dependencies_given=depends_on is not None, fit=fit
        )
    elif running and qos is None and gpus is None and depends_on is None:
        _check_running_limit(db, principal, job, old_limit, spec.time_limit_s)
    else:
        what = "its time limit only" if running else "nothing"
        raise Conflict(
            f"job {job_id} is {job.state}: {what} can be changed now (kiln hold {job_id} stops a running "
            f"job, checkpoint first; change it, then kiln release {job_id})"
        )
    job.spec = spec.model_dump(mode="json")
    after.update(qos=_qos_name(db, job), time_limit_s=job.time_limit_s, gpus=job.gpus)
    changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
    if changed:
        said = "; ".join(f"{k.replace('_s', '')} {_shown(v[0])} -> {_shown(v[1])}" for k, v in changed.items())
        record_event(
            db,
            EventType.UPDATED,
            job=job,
            message=f"{said} (by {principal.name})",
            data=changed,
            actor_user_id=principal.user_id,
        )
        job.updated_at = utcnow()
        db.flush()
        notify_jobs_changed(db, str(job_id))
    return get(db=db, principal=principal, job_id=job_id)


def _change_queued(
    db: Session, principal: Principal, job: Job, spec: JobSpec, *, dependencies_given: bool, fit: FitSettings
) -> list[str] | None:
    """A queued job takes ``spec``, checked as a submission is: priority and contract follow the class; the GPU
    count changes only while the job has no checkpoint (a checkpoint is of its model on its GPUs); dependencies
    name jobs of the team and close no cycle (which would keep every job in it waiting for good). The new
    dependencies as ``_dependency_refs`` writes them, when given."""
    if spec.resources.gpus != job.gpus and job.last_step > 0:
        raise Conflict(
            f"job {job.id} has trained to step {job.last_step} on {job.gpus} GPU(s) and resumes from its "
            f"checkpoint on as many; kiln clone {job.id} --set resources.gpus={spec.resources.gpus} starts "
            "it anew on another count"
        )
    ctx, team_id, fitted = checked(db, principal, spec, fit=fit)
    refs = None
    if dependencies_given:
        deps = dependencies(db, team_id=team_id, team=spec.team, refs=spec.depends_on)
        direct = {d for d, _ in deps}
        if job.id in direct or job.id in jobs_repo.dependency_closure(db, direct):
            raise InvalidInput.at(
                "depends_on", f"job {job.id} would wait for itself: it would depend on a job that waits for it"
            )
        jobs_repo.replace_dependencies(db, job_id=job.id, depends_on=deps)
        refs = _as_refs(deps)
    job.qos_class_id, job.priority = ctx.qos_id, ctx.priority
    job.predicted_memory_bytes = fitted.predicted_memory_bytes
    job.gpus, job.gpu_type = spec.resources.gpus, spec.resources.gpu_type if spec.resources.gpus else "cpu"
    contract = jobs_repo.effective_sla(db, job.id)
    if contract is not None:
        contract.qos_class_id = ctx.qos_id
    return refs


def _qos_name(db: Session, job: Job) -> str | None:
    qos = db.get(QosClass, job.qos_class_id)
    return qos.name if qos is not None else None


def _dependency_refs(db: Session, job_id: int) -> list[str]:
    return _as_refs(jobs_repo.dependencies(db, job_id))


def _as_refs(dependencies: Sequence[tuple[int, str]]) -> list[str]:
    """(job id, condition) pairs, by job id, as a spec writes them (``afterok:12``)."""
    return [f"{condition}:{dep}" for dep, condition in dependencies]


def _check_running_limit(db: Session, principal: Principal, job: Job, old: float | None, new: float | None) -> None:
    """A running job's new time limit: lower it, anyone who may change the job; raise or remove it, a team admin
    or an admin (the scheduler planned around the old one: Slurm's rule); never below what the job has run."""
    raised = new is None if old is None else new is None or new > old
    if raised and old != new and _admin_role(principal, job.team_id) is None:
        raise Forbidden(
            f"only a team admin or an admin may raise or remove a running job's time limit (job "
            f"{job.id}: {_shown(old)}); you may lower it"
        )
    if new is not None:
        ran = job.ran_s(utcnow())
        if new <= ran:
            raise InvalidInput.at(
                "time_limit_s",
                f"job {job.id} has already run {ran:.0f} s: a limit of {new:g} s "
                f"would end it at once (kiln cancel {job.id} stops it)",
            )


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(value) or "none"
    return "none" if value is None else f"{value:g} s" if isinstance(value, float) else str(value)


def _admin_role(principal: Principal, team_id: int) -> str | None:
    """ "admin" or "team admin" when the principal is one for the team (its holds are admin holds), else None."""
    if principal.is_admin:
        return "admin"
    return "team admin" if principal.roles.get(team_id) == Role.TEAM_ADMIN else None


def _changeable(db: Session, principal: Principal, job_id: int) -> Job:
    """The job, locked, when the principal may change it (a member of its team); else 404 or 403."""
    job = _visible(db, principal, job_id, for_update=True)
    team = teams_repo.get_by_id(db, job.team_id)
    assert team is not None
    require_team(principal, team, team.name, Role.MEMBER)
    return job


def events(
    *, db: Session, principal: Principal, job_id: int, after_id: int = 0, limit: int = 100
) -> list[tuple[Event, str | None]]:
    _visible(db, principal, job_id)
    return list(jobs_repo.events(db, job_id=job_id, after_id=after_id, limit=limit))


def attempts(*, db: Session, principal: Principal, job_id: int, window: Window | None = None) -> Sequence[Attempt]:
    _visible(db, principal, job_id)
    return jobs_repo.attempts(db, job_id, window)


def checkpoints(
    *, db: Session, principal: Principal, job_id: int, window: Window | None = None
) -> Sequence[Checkpoint]:
    _visible(db, principal, job_id)
    return jobs_repo.checkpoints(db, job_id, window)


def metrics(
    *, db: Session, principal: Principal, job_id: int, after_step: int = -1, max_points: int = 1000
) -> Sequence[JobMetric]:
    _visible(db, principal, job_id)
    return jobs_repo.metrics(db, job_id=job_id, after_step=after_step, max_points=max_points)


def checkpoint_advice(*, db: Session, principal: Principal, job_id: int) -> CheckpointAdvice | None:
    return advise(db, _visible(db, principal, job_id), utcnow())


def why(*, db: Session, principal: Principal, job_id: int, forecaster: Forecaster | None = None) -> Why:
    return explain(db=db, job=_visible(db, principal, job_id), forecaster=forecaster)


@dataclass(frozen=True)
class LogTarget:
    job_id: int
    team_id: int
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
    return LogTarget(job_id=job_id, team_id=job.team_id, attempt=number, path=path, state=job.state)
