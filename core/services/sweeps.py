"""Sweeps (job arrays): one submission expanded over a grid or a list of settings into jobs that share the sweep.

A sweep document is a job spec with a ``sweep`` section::

    sweep:
      grid: {lr: [0.001, 0.003], batch_size: [8, 16]}   # every combination: 4 jobs
      list: [{lr: 0.01}, {lr: 0.03, steps: 200}]         # or these settings, one job each
      max_concurrent: 2                                   # at most 2 of its jobs run at once (Slurm's %N)

A key names a field of the spec (``steps``, ``resources.gpus``: a dotted path) or else a hyperparameter of the
recipe (``lr`` is ``recipe.hyperparameters.lr``). Job ``i`` is named ``<name>-<i>``. The scheduler holds back
jobs beyond ``max_concurrent`` with the pending reason ``SweepLimit``.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ValidationError
from sqlalchemy.orm import Session

from core.models import Job, Role, Sweep
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.repositories.keyset import Window
from core.services.errors import InvalidInput, NotFound
from core.services.jobs import submit
from core.services.principal import Principal, require_team_id
from core.spec import JobSpec, SpecError, StrictModel, parse_spec_data, validation_errors
from core.states import JobState

MAX_JOBS = 256


class SweepSection(StrictModel):
    grid: Annotated[dict[str, list[Any]], Field(max_length=16)] = Field(default_factory=dict)
    list_: Annotated[list[dict[str, Any]], Field(alias="list", max_length=MAX_JOBS)] = Field(default_factory=list)
    max_concurrent: Annotated[int | None, Field(ge=1, le=MAX_JOBS)] = None


@dataclass(frozen=True)
class SweepView:
    sweep: Sweep
    team: str
    user: str | None
    keys: list[str]  # the settings it varies, in order
    jobs: list[Job]  # best first (see ``ranked``)


def settings_of(section: SweepSection) -> list[dict[str, Any]]:
    """One dict of settings per job: the grid's product, or the list as given."""
    if section.grid and section.list_:
        raise InvalidInput.at("sweep", "give a grid or a list, not both")
    if section.list_:
        return [dict(point) for point in section.list_]
    if not section.grid:
        raise InvalidInput.at("sweep", "a sweep needs a grid (every combination) or a list of settings")
    for key, values in section.grid.items():
        if not values:
            raise InvalidInput.at(f"sweep.grid.{key}", "no values")
    count = math.prod(len(v) for v in section.grid.values())
    if count > MAX_JOBS:
        raise InvalidInput.at("sweep.grid", f"{count} combinations; at most {MAX_JOBS} jobs per sweep")
    keys = list(section.grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*section.grid.values())]


def _path(key: str) -> list[str]:
    if "." in key or key in JobSpec.model_fields:
        return key.split(".")
    return ["recipe", "hyperparameters", key]


def expand(base: dict[str, Any], settings: dict[str, Any], name: str) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for key, value in settings.items():
        *parents, leaf = _path(key)
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InvalidInput.at(f"sweep.{key}", f"{part!r} is not a section of the spec")
            node = child
        node[leaf] = value
    data["name"] = name
    return data


def parse(document: dict[str, Any]) -> tuple[SweepSection, list[JobSpec], dict[str, Any]]:
    """(the sweep section, each job's validated spec, the base spec) from a sweep document."""
    base = dict(document)
    raw = base.pop("sweep", None)
    if not isinstance(raw, dict):
        raise InvalidInput.at("sweep", "a sweep document is a job spec with a sweep section (grid or list)")
    try:
        section = SweepSection.model_validate(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": f"sweep.{e['loc']}"} for e in validation_errors(exc)]
        raise SpecError(f"invalid sweep: {errors[0]['loc']}: {errors[0]['msg']}", errors) from exc
    points = settings_of(section)
    name = str(base.get("name", "sweep"))[:58]
    specs = []
    for i, point in enumerate(points):
        try:
            specs.append(parse_spec_data(expand(base, point, f"{name}-{i}")))
        except SpecError as exc:
            raise SpecError(f"sweep job {i} ({point}): {exc}", exc.errors) from None
    return section, specs, base


def submit_sweep(*, db: Session, principal: Principal, document: dict[str, Any]) -> SweepView:
    section, specs, base = parse(document)
    team = specs[0].team
    team_id = require_team_id(principal, teams_repo.id_by_name(db, team), team, Role.MEMBER)
    sweep = Sweep(
        name=specs[0].name.rsplit("-", 1)[0],
        team_id=team_id,
        user_id=principal.user_id,
        parameters=section.model_dump(mode="json", by_alias=True),
        max_concurrent=section.max_concurrent,
    )
    db.add(sweep)
    db.flush()
    for spec in specs:
        submit(db=db, principal=principal, spec=spec, sweep_id=sweep.id)
    return get(db=db, principal=principal, sweep_id=sweep.id)


def keys_of(sweep: Sweep) -> list[str]:
    params = sweep.parameters or {}
    keys = list((params.get("grid") or {}).keys())
    for point in params.get("list") or []:
        keys += [k for k in point if k not in keys]
    return keys


def setting(job: Job, key: str) -> Any:
    node: Any = job.spec
    for part in _path(key):
        node = node.get(part) if isinstance(node, dict) else None
    return node


RANKING = "succeeded jobs by final loss (lower is better), then the others by their last loss, then those with none"


def ranked(jobs: list[Job]) -> list[Job]:
    """Best first: succeeded jobs by final loss, then the others by their last loss, then those with none."""

    def key(job: Job) -> tuple[int, float, int]:
        done = job.state == JobState.SUCCEEDED
        loss = job.last_loss if job.last_loss is not None and math.isfinite(job.last_loss) else math.inf
        return (0 if done else 1 if loss < math.inf else 2, loss, job.id)

    return sorted(jobs, key=key)


def get(*, db: Session, principal: Principal, sweep_id: int) -> SweepView:
    sweep = db.get(Sweep, sweep_id)
    if sweep is None or not principal.can_see(sweep.team_id):
        raise NotFound(f"sweep {sweep_id} not found")
    team = teams_repo.get_by_id(db, sweep.team_id)
    user = users_repo.names_by_id(db, [sweep.user_id]).get(sweep.user_id or 0)
    jobs = list(jobs_repo.of_sweep(db, sweep.id))
    return SweepView(sweep, team.name if team else "", user, keys_of(sweep), ranked(jobs))


def list_sweeps(*, db: Session, principal: Principal, window: Window | None = None) -> Sequence[Sweep]:
    """Newest first."""
    return jobs_repo.sweeps(db, team_ids=principal.visible_team_ids(), window=window)
