"""Sweeps (job arrays): one submission expanded over a grid, a list or random draws of settings into jobs that
share the sweep. The document and its expansion: ``core.sweeps.spec``; here, submitting it and what is done with a
sweep's jobs afterwards (hold, release, cancel, close).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from core import webhooks
from core.db import utcnow
from core.models import Job, Role, Sweep
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.repositories.keyset import Window
from core.services import jobs as jobs_svc
from core.services.errors import NotFound, QueueFull
from core.services.fit import FitSettings
from core.services.principal import Principal, require_team_id
from core.states import TERMINAL, JobState
from core.sweeps.ranking import Objective, objective_of, ranked
from core.sweeps.spec import EarlyStopping, SweepSection, key_path, parse


@dataclass(frozen=True)
class SweepView:
    sweep: Sweep
    team: str
    user: str | None
    keys: list[str]  # the settings it varies, in order
    objective: Objective
    jobs: list[Job]  # best first (see ``ranked``)


def submit_sweep(
    *,
    db: Session,
    principal: Principal,
    document: dict[str, Any],
    hold: bool = False,
    max_unfinished: int = jobs_svc.MAX_UNFINISHED,
    fit: FitSettings = FitSettings(),
) -> SweepView:
    """``hold``: every job of the sweep is submitted held (released one by one or with ``kiln release --sweep``).
    ``max_unfinished``: a sweep whose jobs would bring its team past that many unfinished jobs is refused whole
    (QueueFull), counted under the team's row as each submission is."""
    section, specs, base = parse(document)
    team = specs[0].team
    team_id = require_team_id(principal, teams_repo.id_by_name(db, team), team, Role.MEMBER)
    teams_repo.lock_for_submissions(db, team_id)
    unfinished = jobs_repo.count_unfinished(db, team_id)
    if unfinished + len(specs) > max_unfinished:
        raise QueueFull(team, unfinished, max_unfinished, adding=len(specs))
    sweep = Sweep(
        name=specs[0].name.rsplit("-", 1)[0],
        team_id=team_id,
        user_id=principal.user_id,
        parameters=section.model_dump(mode="json", by_alias=True, exclude_unset=True),
        max_concurrent=section.max_concurrent,
        search=section.search,
    )
    db.add(sweep)
    db.flush()
    for spec in specs:
        jobs_svc.submit(
            db=db, principal=principal, spec=spec, sweep_id=sweep.id, hold=hold, max_unfinished=max_unfinished, fit=fit
        )
    return get(db=db, principal=principal, sweep_id=sweep.id)


def section_of(sweep: Sweep) -> SweepSection:
    """The sweep section as stored (validated when it was submitted)."""
    return SweepSection.model_validate(sweep.parameters or {})


def keys_of(sweep: Sweep) -> list[str]:
    params = sweep.parameters or {}
    keys = [*(params.get("grid") or {}), *(params.get("random") or {})]
    for point in params.get("list") or []:
        keys += [k for k in point if k not in keys]
    return keys


def setting(job: Job, key: str) -> Any:
    node: Any = job.spec
    for part in key_path(key):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def early_stopping_of(sweep: Sweep) -> EarlyStopping | None:
    raw = (sweep.parameters or {}).get("early_stopping")
    return None if raw is None else EarlyStopping.model_validate(raw)


def get(*, db: Session, principal: Principal, sweep_id: int) -> SweepView:
    sweep = db.get(Sweep, sweep_id)
    if sweep is None or not principal.can_see(sweep.team_id):
        raise NotFound(f"sweep {sweep_id} not found")
    team = teams_repo.get_by_id(db, sweep.team_id)
    user = users_repo.names_by_id(db, [sweep.user_id]).get(sweep.user_id or 0)
    jobs = list(jobs_repo.of_sweep(db, sweep.id))
    objective = objective_of(sweep)
    return SweepView(sweep, team.name if team else "", user, keys_of(sweep), objective, ranked(jobs, objective))


def list_sweeps(*, db: Session, principal: Principal, window: Window | None = None) -> Sequence[Sweep]:
    """Newest first."""
    return jobs_repo.sweeps(db, team_ids=principal.visible_team_ids(), window=window)


def hold_queued(*, db: Session, principal: Principal, sweep_id: int, reason: str | None = None) -> SweepView:
    """Hold every queued job of the sweep that is not held (Slurm's ``scontrol hold`` of a job array: its pending
    tasks), in one transaction: a job the caller may not change refuses them all."""
    for job in get(db=db, principal=principal, sweep_id=sweep_id).jobs:
        if job.state == JobState.QUEUED and job.held_at is None and not job.cancel_requested:
            jobs_svc.hold(db=db, principal=principal, job_id=job.id, reason=reason)
    return get(db=db, principal=principal, sweep_id=sweep_id)


def release_held(*, db: Session, principal: Principal, sweep_id: int) -> SweepView:
    """Release every held job of the sweep, in one transaction."""
    for job in get(db=db, principal=principal, sweep_id=sweep_id).jobs:
        if job.held_at is not None and JobState(job.state) not in TERMINAL:
            jobs_svc.release(db=db, principal=principal, job_id=job.id)
    return get(db=db, principal=principal, sweep_id=sweep_id)


def cancel_all(*, db: Session, principal: Principal, sweep_id: int, reason: str | None = None) -> SweepView:
    """Cancel every job of the sweep that has not ended (a running one stops, checkpoint first), in one
    transaction (Determined's ``experiment kill``)."""
    view = get(db=db, principal=principal, sweep_id=sweep_id)
    if view.sweep.search is not None and view.sweep.closed_at is None:
        # Closed under its row's lock (a cycle proposing for it finishes first) before its jobs are read again: a
        # job proposed meanwhile is among them, and none is proposed after.
        close(db, view.sweep, f"cancelled by {principal.name}")
        view = get(db=db, principal=principal, sweep_id=sweep_id)
    for job in view.jobs:
        if JobState(job.state) not in TERMINAL and not job.cancel_requested:
            jobs_svc.cancel(db=db, principal=principal, job_id=job.id, reason=reason)
    return get(db=db, principal=principal, sweep_id=sweep_id)


def close(db: Session, sweep: Sweep, reason: str) -> None:
    """Its search proposes no more jobs (``core.sweeps.search``), and says why; a sweep closed meanwhile
    keeps its reason. Its row is locked first (the scheduler's cycle holds it already; the events deliverer takes
    it to tell of a sweep's end, ``core.webhooks``), so of the two one writes ``sweep_finished``. Closed before its
    count with every job already ended, the sweep has finished now: its ``sweep_finished`` webhook is written here,
    since no job's end is left to write it (an end not committed yet is read by the deliverer, after this close)."""
    db.refresh(sweep, with_for_update=True)
    if sweep.closed_at is not None:
        return
    states = jobs_repo.states_of_sweep(db, sweep.id)
    early = sweep.jobs_to_come(len(states)) > 0
    sweep.closed_at = utcnow()
    sweep.closed_reason = reason[:512]
    if early and states and all(JobState(state) in TERMINAL for state in states):
        webhooks.enqueue_for_closed_search(db, sweep)
