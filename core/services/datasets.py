"""Datasets: a team-admin names directories of the storage root's data area; a job's spec names them; the worker
mounts them read-only for the attempt (docs/user-code.md, "Datasets").

The team's viewers list them; its team-admins register and remove them. A path is checked against
``core.datasets`` (relative, in ``datasets/<team>/`` or ``datasets/_shared/``, no ``..``, no link out, an existing
directory) when it is registered; a spec may name only its own team's datasets (``check_names``, at submit).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.datasets import DatasetPathError, resolve
from core.db import utcnow
from core.models import Dataset, Job, Role
from core.repositories import teams as teams_repo
from core.services.errors import Conflict, InvalidInput, NotFound
from core.services.principal import Principal, require_team
from core.spec import did_you_mean
from core.states import TERMINAL


@dataclass(frozen=True)
class DatasetView:
    dataset: Dataset
    available: bool  # the directory is there now, and still inside its area
    problem: str | None  # why not, when it is not


def _view(storage: Path, team: str, dataset: Dataset) -> DatasetView:
    try:
        resolve(storage, dataset.path, team)
    except DatasetPathError as exc:
        return DatasetView(dataset, available=False, problem=str(exc))
    return DatasetView(dataset, available=True, problem=None)


def list_for_team(*, db: Session, principal: Principal, team: str, storage: Path) -> list[DatasetView]:
    team_id = require_team(principal, teams_repo.get_by_name(db, team), team, Role.VIEWER).id
    rows = db.scalars(select(Dataset).where(Dataset.team_id == team_id).order_by(Dataset.name))
    return [_view(storage, team, d) for d in rows]


def get(*, db: Session, principal: Principal, team: str, name: str, storage: Path) -> DatasetView:
    team_id = require_team(principal, teams_repo.get_by_name(db, team), team, Role.VIEWER).id
    dataset = db.scalar(select(Dataset).where(Dataset.team_id == team_id, Dataset.name == name))
    if dataset is None:
        raise NotFound(f"no dataset {name!r} in team {team!r}")
    return _view(storage, team, dataset)


def register(
    *, db: Session, principal: Principal, team: str, name: str, path: str, description: str | None, storage: Path
) -> DatasetView:
    team_id = require_team(principal, teams_repo.get_by_name(db, team), team, Role.TEAM_ADMIN).id
    try:
        resolve(storage, path, team)
    except DatasetPathError as exc:
        raise InvalidInput.at("path", str(exc), "dataset_path") from None
    if db.scalar(select(Dataset.id).where(Dataset.team_id == team_id, Dataset.name == name)) is not None:
        raise Conflict(f"team {team!r} already has a dataset {name!r}: remove it first to point it elsewhere")
    normalised = "/".join(p for p in path.split("/") if p not in ("", "."))
    dataset = Dataset(
        team_id=team_id,
        name=name,
        path=normalised,
        description=description,
        created_by_user_id=principal.user_id,
        created_at=utcnow(),
    )
    db.add(dataset)
    db.flush()
    return DatasetView(dataset, available=True, problem=None)


def remove(*, db: Session, principal: Principal, team: str, name: str) -> None:
    """Refused (409) while a job that has not ended (queued, running, lost and due a restart...) names it: its
    next attempt could not start."""
    team_id = require_team(principal, teams_repo.get_by_name(db, team), team, Role.TEAM_ADMIN).id
    dataset = db.scalar(select(Dataset).where(Dataset.team_id == team_id, Dataset.name == name))
    if dataset is None:
        raise NotFound(f"no dataset {name!r} in team {team!r}")
    active = db.execute(
        select(Job.id, Job.state, Job.spec)
        .where(Job.team_id == team_id, Job.state.not_in([s.value for s in TERMINAL]))
        .order_by(Job.id)
    )
    users = [(job_id, state) for job_id, state, spec in active if name in ((spec or {}).get("datasets") or [])]
    if users:
        named = ", ".join(f"{job_id} ({state})" for job_id, state in users[:5])
        raise Conflict(
            f"dataset {name!r} is named by jobs that have not ended: {named}; cancel them or wait for them to end"
        )
    db.delete(dataset)


def check_names(db: Session, *, team_id: int, team: str, names: list[str]) -> dict[str, str]:
    """At submit: the datasets a spec names, each one the team's (422 at ``datasets.N`` with the closest known name
    otherwise); returns name -> path."""
    if not names:
        return {}
    known = {d.name: d.path for d in db.scalars(select(Dataset).where(Dataset.team_id == team_id))}
    for i, name in enumerate(names):
        if name not in known:
            hint = did_you_mean(name, sorted(known))
            have = f" (it has: {', '.join(sorted(known))})" if known and not hint else ""
            raise InvalidInput.at(
                f"datasets.{i}", f"team {team!r} has no dataset {name!r}{hint}{have}", "unknown_dataset"
            )
    return {n: known[n] for n in names}


def paths_for(db: Session, *, team_id: int, names: list[str]) -> dict[str, str]:
    """For the worker: name -> registered path of the names that still exist (a missing one is the caller's to
    report)."""
    if not names:
        return {}
    rows = db.scalars(select(Dataset).where(Dataset.team_id == team_id, Dataset.name.in_(names)))
    return {d.name: d.path for d in rows}
