"""SLA contracts: a team's default, and the effective contract of each job (the default merged with the spec)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Job, Role, SlaContract, Team
from core.repositories import jobs as jobs_repo
from core.repositories import qos as qos_repo
from core.repositories import step_times
from core.repositories import teams as teams_repo
from core.services.errors import Forbidden, InvalidInput, NotFound, PreconditionFailed
from core.services.principal import Principal, require_team
from core.spec import SLAOverrides
from core.states import JobState

DEFAULT_QOS = "silver"
# The contract's terms are the spec's SLA overrides less the QoS class (a column of its own).
TERMS = tuple(name for name in SLAOverrides.model_fields if name != "qos")
# The column defaults, for a team that never set a default contract.
BASE_TERMS: dict[str, Any] = {
    "max_queue_wait_s": None,
    "deadline": None,
    "max_restarts": 3,
    "recovery_time_objective_s": 300.0,
    "checkpoint_interval_s": 600.0,
    "min_checkpoint_success_rate": 0.999,
    "step_time_tolerance": 1.3,
}


def _qos_id(db: Session, name: str, loc: str) -> int:
    qos = qos_repo.get_by_name(db, name)
    if qos is None:
        raise InvalidInput.at(loc, f"unknown QoS class {name!r}")
    return qos.id


def default_contract(*, db: Session, team: Team) -> SlaContract:
    """The team's default row, or an unsaved one with the built-in terms (QoS ``silver``)."""
    row = teams_repo.default_sla(db, team.id)
    if row is not None:
        return row
    contract = SlaContract(
        team_id=team.id, job_id=None, qos_class_id=_qos_id(db, DEFAULT_QOS, "qos"), version=0, **BASE_TERMS
    )
    contract.qos_class = qos_repo.get_by_name(db, DEFAULT_QOS)  # type: ignore[assignment]
    return contract


def get_team_default(*, db: Session, principal: Principal, team: str) -> SlaContract:
    t = require_team(principal, teams_repo.get_by_name(db, team), team)
    return default_contract(db=db, team=t)


def qos_refusal(team: str, qos: str, allowed: Sequence[str]) -> str:
    return (
        f"team {team!r} may not use QoS class {qos!r} (it may use: {', '.join(allowed) or 'none'}); "
        "which classes a team may use is an admin's decision"
    )


def restart_refusal(team: str, asked: int, limit: int) -> str:
    return f"max_restarts {asked} is above team {team!r}'s restart limit of {limit}, which an admin sets"


def put_team_default(
    *, db: Session, principal: Principal, team: str, terms: Mapping[str, Any], if_version: int | None = None
) -> SlaContract:
    """Replace the team's default terms (team-admins and admins). ``terms`` may carry ``qos`` by name; the class
    must be one the team may use, and ``max_restarts`` within the team's restart limit. ``if_version``: only if
    the contract is still at that version (0: the built-in terms, never set), as ``If-Match`` asks."""
    t = require_team(principal, teams_repo.get_by_name(db, team), team, Role.TEAM_ADMIN)
    qos = terms.get("qos") or DEFAULT_QOS
    qos_id = _qos_id(db, qos, "qos")
    if qos_id not in {q.id for q in t.qos_classes}:
        raise Forbidden(qos_refusal(team, qos, teams_repo.allowed_qos_names(db, t.id)))
    max_restarts = terms.get("max_restarts", BASE_TERMS["max_restarts"])
    if max_restarts > t.restart_limit:
        raise Forbidden(restart_refusal(team, max_restarts, t.restart_limit))
    row = teams_repo.default_sla(db, t.id)
    if row is None:
        if if_version not in (None, 0):
            raise PreconditionFailed.stale(f"team {team!r}'s contract", if_version, 0)
        row = SlaContract(team_id=t.id, job_id=None, qos_class_id=qos_id)
        db.add(row)
    elif not teams_repo.bump_version(db, row, expected=if_version):
        raise PreconditionFailed.stale(f"team {team!r}'s contract", if_version, row.version)
    row.qos_class_id = qos_id
    for key in TERMS:
        setattr(row, key, terms.get(key, BASE_TERMS[key]))
    db.flush()
    db.refresh(row)
    return row


def effective_terms(*, base: SlaContract | Mapping[str, Any], overrides: SLAOverrides) -> dict[str, Any]:
    """The team default's terms (a contract row, or its terms by name) with every term the spec sets replacing it."""
    if isinstance(base, SlaContract):
        terms = {key: getattr(base, key) for key in TERMS}
    else:
        terms = {key: base[key] for key in TERMS}
    for key in TERMS:
        value = getattr(overrides, key)
        if value is not None:
            terms[key] = datetime.fromisoformat(value) if key == "deadline" else value
    return terms


# What the SLA evaluator (scheduler.live.sla) measures from a job's reported steps, and the violation it records.
STEP_TERMS = {"step_time_tolerance": step_times.VIOLATION, "deadline": EventType.SLA_DEADLINE_VIOLATION}
Standing = Literal["met", "violated", "unmeasured"]
MET: Standing = "met"
VIOLATED: Standing = "violated"
UNMEASURED: Standing = "unmeasured"


def step_standing(db: Session, *, job: Job, contract: SlaContract) -> dict[str, Standing]:
    """How the job stands on the terms measured from its steps: ``violated`` (the evaluator recorded it), ``met``,
    or ``unmeasured`` until an attempt's pace could be compared (``step_times.measured_jobs``: a script in script
    mode that reports no step time, a job that has not trained yet, or one whose steps were too few or too brief for
    a baseline and a recent window), and always for the step time of a best-effort GPU share (no speed is promised
    to it: ``jobs_repo.best_effort_shares``): never ``met`` for what nobody measured. The deadline's own violation
    (not done by then) needs no step; its projection while the job runs does."""
    violated = jobs_repo.event_types_of(db, job.id, list(STEP_TERMS.values()))
    measured = bool(step_times.measured_jobs(db, [job.id]))
    best_effort_share = bool(jobs_repo.best_effort_shares(db, [job.id]))
    out: dict[str, Standing] = {}
    for term, event in STEP_TERMS.items():
        if term == "deadline" and contract.deadline is None:
            continue
        if event in violated:
            out[term] = VIOLATED
        elif term == "deadline" and job.state == JobState.SUCCEEDED:
            out[term] = MET
        elif term == "step_time_tolerance" and best_effort_share:
            out[term] = UNMEASURED
        else:
            out[term] = MET if measured else UNMEASURED
    return out


def get_job_contract(*, db: Session, principal: Principal, job_id: int) -> tuple[SlaContract, str, dict[str, Standing]]:
    """(the job's effective contract, its team's name, its standing on the terms measured from steps)."""
    job = jobs_repo.get(db, job_id)
    if job is None or not principal.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    team = teams_repo.get_by_id(db, job.team_id)
    assert team is not None
    contract = jobs_repo.effective_sla(db, job_id)
    if contract is None:  # a job written by something other than submit(): its team's default applies
        contract = default_contract(db=db, team=team)
    return contract, team.name, step_standing(db, job=job, contract=contract)
