"""Submission: a spec checked against its team, its QoS class and the cluster, then written as a QUEUED job with its
effective contract and SUBMITTED event in one statement (``submissions_repo.insert_submitted``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core.db import utcnow
from core.event_types import EventType
from core.models import Role
from core.notify import CHANNEL
from core.repositories import jobs as jobs_repo
from core.repositories import submissions as submissions_repo
from core.repositories import teams as teams_repo
from core.services import artifacts
from core.services import datasets as datasets_svc
from core.services.auto_choices import Chosen, choose
from core.services.errors import Forbidden, InvalidInput, QueueFull
from core.services.fit import NO_HOST_YET, FitSettings, Fitted, canonical_gpu_type, check_submission
from core.services.job_view import JobView
from core.services.principal import Principal, require_team_id
from core.services.sla import BASE_TERMS, DEFAULT_QOS, TERMS, effective_terms, qos_refusal, restart_refusal
from core.settings import ApiLimits
from core.spec import JobSpec, did_you_mean
from core.states import JobState, Reason


@dataclass(frozen=True)
class Idempotency:
    """A submission's ``Idempotency-Key`` and the hash of its body: a retry finds the job the first one made."""

    key: str
    request_sha256: str


# A team's unfinished jobs at most, unless the caller says otherwise (the API and the scheduler pass
# KILN_MAX_UNFINISHED_JOBS_PER_TEAM): the setting's default, read from the setting.
MAX_UNFINISHED: int = ApiLimits.model_fields["max_unfinished_jobs_per_team"].default


def submit(
    *,
    db: Session,
    principal: Principal,
    spec: JobSpec,
    idempotency: Idempotency | None = None,
    sweep_id: int | None = None,
    hold: bool = False,
    max_unfinished: int = MAX_UNFINISHED,
    fit: FitSettings = FitSettings(),
) -> JobView:
    """Statements: one read (team, default contract, QoS, what the cluster has of the GPU type:
    ``teams_repo.submission_context``), one more only when ``depends_on`` is set or the request cannot fit, and
    on PostgreSQL one write (job, dependencies, contract, event and NOTIFY together; in autocommit, one more that
    makes it durable: ``submissions_repo.insert_submitted``). The answer is built from what was written: nothing
    is read back. ``idempotency``: the key is stored with the job (``submit_once``). ``hold``: the job is submitted
    held (Slurm's ``sbatch --hold``) and waits for ``release``.

    ``max_unfinished``: QueueFull when the team has that many unfinished jobs already. The write takes the place
    under the team's row lock (``submissions_repo.insert_submitted``), so two submissions at once cannot both take
    the last place, and the lock is held only for the write, not through the checks before it."""
    spec = canonical_gpu_type(spec)
    ctx, team_id, fitted = checked(db, principal, spec, fit=fit)
    code_digest = _code_digest(db, team_id=team_id, spec=spec)
    datasets_svc.check_names(db, team_id=team_id, team=spec.team, names=spec.datasets)
    depends_on = dependencies(db, team_id=team_id, team=spec.team, refs=spec.depends_on)
    base = {k: getattr(ctx, k) for k in TERMS} if ctx.sla_id is not None else BASE_TERMS
    terms = effective_terms(base=base, overrides=spec.sla)
    if terms["max_restarts"] > ctx.restart_limit:
        raise Forbidden(restart_refusal(spec.team, terms["max_restarts"], ctx.restart_limit))
    now = utcnow()
    chosen = choose(db, spec=spec, team_id=team_id, contract_interval_s=terms["checkpoint_interval_s"], now=now)
    spec = chosen.spec
    values = _job_values(
        spec,
        principal=principal,
        ctx=ctx,
        team_id=team_id,
        fitted=fitted,
        chosen=chosen,
        code_digest=code_digest,
        sweep_id=sweep_id,
        idempotency=idempotency,
        hold=hold,
        now=now,
    )
    message, data = _submitted_event(
        principal=principal, ctx=ctx, values=values, depends_on=depends_on, chosen=chosen, fitted=fitted, hold=hold
    )
    spec_json = json.dumps(values["spec"])  # serialized once: the write and the answer
    job_id = submissions_repo.insert_submitted(
        db,
        job=values,
        spec_json=spec_json,
        depends_on=depends_on,
        contract=terms,
        event_type=EventType.SUBMITTED,
        event_message=message,
        event_data=data,
        channel=CHANNEL,
        max_unfinished=max_unfinished,
    )
    if job_id is None:
        raise QueueFull(spec.team, jobs_repo.count_unfinished(db, team_id), max_unfinished)
    return _written(job_id, spec, principal=principal, ctx=ctx, values=values, spec_json=spec_json, hold=hold)


def _job_values(
    spec: JobSpec,
    *,
    principal: Principal,
    ctx: Any,
    team_id: int,
    fitted: Fitted,
    chosen: Chosen,
    code_digest: str | None,
    sweep_id: int | None,
    idempotency: Idempotency | None,
    hold: bool,
    now: datetime,
) -> dict[str, Any]:
    """The new job's row: every NOT NULL column of ``jobs`` (``submissions_repo.insert_submitted`` writes them all)."""
    return {
        "name": spec.name,
        "team_id": team_id,
        "user_id": principal.user_id,
        "spec": spec.model_dump(mode="json"),
        "state": JobState.QUEUED.value,
        "qos_class_id": ctx.qos_id,
        "priority": ctx.priority,
        "gpus": spec.resources.gpus,
        "gpu_type": spec.resources.gpu_type if spec.resources.gpus else "cpu",
        "predicted_memory_bytes": chosen.memory_bytes(fitted.predicted_memory_bytes),
        "restart_count": 0,
        "fencing_token": 0,
        "cancel_requested": False,
        "preempt_requested": False,
        "last_step": 0,
        "submitted_at": now,
        "updated_at": now,
        "sweep_id": sweep_id,
        "code_digest": code_digest,
        "idempotency_key": idempotency.key if idempotency else None,
        "request_sha256": idempotency.request_sha256 if idempotency else None,
        "held_at": now if hold else None,
        "held_by_admin": False,
        **_pending_at_submit(principal, fitted, hold),
    }


def _submitted_event(
    *,
    principal: Principal,
    ctx: Any,
    values: dict[str, Any],
    depends_on: list[tuple[int, str]],
    chosen: Chosen,
    fitted: Fitted,
    hold: bool,
) -> tuple[str, dict[str, Any]]:
    """The SUBMITTED event's message and data: who, the class and priority, what kiln chose where the spec said
    auto, and a wait for capacity not yet joined."""
    message = f"submitted by {principal.name} (qos {ctx.qos}, priority {ctx.priority})" + (", held" if hold else "")
    data = {
        "qos": ctx.qos,
        "priority": ctx.priority,
        "gpus": values["gpus"],
        "depends_on": [d for d, _ in depends_on],
        "held": hold,
    }
    if chosen.data:  # what kiln chose where the spec said auto, and why
        message += "; " + "; ".join(chosen.said)
        data["auto"] = chosen.data
    if fitted.waits_for is not None:
        data["waits_for_capacity"] = fitted.waits_for
        if fitted.waits_for != NO_HOST_YET:  # an operator's choice, worth a line in the timeline; every job of a
            message += f"; {WAITS_FOR_CAPACITY}: {fitted.waits_for}"  # cluster being set up is not
    return message, data


def _written(
    job_id: int, spec: JobSpec, *, principal: Principal, ctx: Any, values: dict[str, Any], spec_json: str, hold: bool
) -> JobView:
    """The answer, built from what was written: nothing is read back."""
    now = values["submitted_at"]
    return JobView(
        id=job_id,
        name=spec.name,
        team=spec.team,
        user=principal.name,
        state=values["state"],
        qos=ctx.qos,
        priority=ctx.priority,
        gpus=values["gpus"],
        gpu_type=values["gpu_type"],
        pending_reason=values["pending_reason"],
        pending_message=values["pending_message"],
        restart_count=0,
        last_step=0,
        last_loss=None,
        steps=spec.steps,
        exit_reason=None,
        cancel_requested=False,
        submitted_at=now,
        admitted_at=None,
        started_at=None,
        finished_at=None,
        queued_s=0.0,
        waiting_since=None if hold else now,
        held_at=values["held_at"],
        spec_json=spec_json,
    )


WAITS_FOR_CAPACITY = "waits for capacity not yet joined"


def _pending_at_submit(principal: Principal, fitted: Fitted, hold: bool) -> dict[str, str | None]:
    """What a new job says before the scheduler's first cycle: held; or, accepted beyond what the registered hosts
    could ever hold (or before any registered), that it waits for capacity not yet joined, and what is lacking. The
    reason itself is the scheduler's to give (Unschedulable, at its next cycle)."""
    if hold:
        return {"pending_reason": Reason.HELD.value, "pending_message": f"held by {principal.name} at submission"}
    message = f"{WAITS_FOR_CAPACITY}: {fitted.waits_for}" if fitted.waits_for is not None else None
    return {"pending_reason": None, "pending_message": message}


def checked(db: Session, principal: Principal, spec: JobSpec, *, fit: FitSettings) -> tuple[Any, int, Fitted]:
    """What a submission (or a change of a queued job) is checked against, in one read: the team (the principal
    a member), its QoS class (known, and one the team may use), and the spec's fit (``check_submission``)."""
    ctx = teams_repo.submission_context(
        db,
        team=spec.team,
        qos=spec.sla.qos,
        default_qos=DEFAULT_QOS,
        terms=TERMS,
        gpu_type=spec.resources.gpu_type,
    )
    team_id = require_team_id(principal, ctx.team_id if ctx is not None else None, spec.team, Role.MEMBER)
    assert ctx is not None
    qos_name = spec.sla.qos or ctx.default_qos or DEFAULT_QOS
    if ctx.qos_id is None:
        loc = "sla.qos" if spec.sla.qos else "team.sla.qos"
        raise InvalidInput.at(loc, f"unknown QoS class {qos_name!r}")
    if not ctx.qos_allowed:
        raise Forbidden(qos_refusal(spec.team, qos_name, teams_repo.allowed_qos_names(db, team_id)))
    return ctx, team_id, check_submission(db, spec=spec, ctx=ctx, qos_name=qos_name, fit=fit)


# A dependency: "12" (after job 12 succeeds) or "CONDITION:12"; Slurm's names and kiln's own.
DEPENDENCY_CONDITIONS = {
    "afterok": "afterok",
    "after_success": "afterok",
    "afterany": "afterany",
    "after_any": "afterany",
    "afternotok": "afternotok",
    "after_failure": "afternotok",
}


def dependencies(db: Session, *, team_id: int, team: str, refs: Sequence[str]) -> list[tuple[int, str]]:
    """(job id, condition) pairs: afterok (it succeeded), afterany (it ended), afternotok (it failed or was
    cancelled)."""
    deps: dict[int, str] = {}
    for i, ref in enumerate(refs):
        word, _, number = ref.rpartition(":")
        condition = DEPENDENCY_CONDITIONS.get(word.strip().lower() or "afterok")
        if condition is None:
            hint = did_you_mean(word, sorted(DEPENDENCY_CONDITIONS))
            raise InvalidInput.at(
                f"depends_on.{i}",
                f"unknown condition {word!r}{hint} (write JOB, or afterok:JOB, afterany:JOB, afternotok:JOB)",
            )
        number = number.strip()
        if not number.isdigit() or len(number) > 18:
            raise InvalidInput.at(f"depends_on.{i}", f"{ref!r} is not a job id (write JOB or CONDITION:JOB)")
        deps[int(number)] = condition
    found = jobs_repo.existing_ids_in_team(db, team_id=team_id, job_ids=list(deps))
    for i, dep in enumerate(deps):
        if dep not in found:
            raise InvalidInput.at(f"depends_on.{i}", f"no job {dep} in team {team!r}")
    return sorted(deps.items())


def _code_digest(db: Session, *, team_id: int, spec: JobSpec) -> str | None:
    """The team's uploaded archive a spec's ``code`` names (it must exist: workers fetch it)."""
    if spec.code is None and spec.command is not None:
        raise InvalidInput.at(
            "code.digest", "a `command:` runs your uploaded code: submit with kiln submit --workdir DIR"
        )
    if spec.code is None:
        return None
    if spec.code.digest is None:
        raise InvalidInput.at("code.digest", "no code uploaded: submit with kiln submit --workdir DIR")
    artifacts.use(db, team_id=team_id, digest=spec.code.digest)
    return spec.code.digest
