"""A team's registered datasets: names for directories of the storage root's data area (docs/user-code.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Response, status
from pydantic import Field

from api.deps import CurrentPrincipal, SessionDep, StorageDirDep
from api.routers.common import ERRORS, LOCATION, PAGE_DEFAULT, CursorQuery, LimitQuery, TeamPath, paged
from api.schemas.common import NEXT_CURSOR_DOC, InModel, OutModel, Text
from core.datasets import MAX_PATH
from core.services import datasets as svc
from core.spec import NAME_PATTERN

router = APIRouter(prefix="/v1/teams/{team}/datasets", tags=["datasets"], responses=ERRORS)

DatasetName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=64, examples=["digits-npz"])]
DatasetPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64, description="Dataset name")]


class DatasetIn(InModel):
    name: DatasetName
    path: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_PATH,
            pattern=r"^[^\x00\\]*$",
            examples=["datasets/default/digits-npz"],
            description="A directory relative to kiln's storage root, under datasets/<team>/ or "
            "datasets/_shared/; it must exist. No absolute path, no '..', no symbolic link out.",
        ),
    ]
    description: Text | None = None


class DatasetOut(OutModel):
    team: str
    name: str
    path: str = Field(description="Relative to kiln's storage root.")
    description: str | None
    created_at: datetime
    available: bool = Field(description="The directory is there now, inside its area (what an attempt checks).")
    problem: str | None = Field(description="Why it is not available, when it is not.")


class DatasetPageOut(OutModel):
    items: list[DatasetOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


def _out(view: svc.DatasetView, team: str) -> DatasetOut:
    d = view.dataset
    return DatasetOut(
        team=team,
        name=d.name,
        path=d.path,
        description=d.description,
        created_at=d.created_at,
        available=view.available,
        problem=view.problem,
    )


@router.get("", response_model=DatasetPageOut, summary="The team's datasets, by name")
def list_datasets(
    team: TeamPath,
    db: SessionDep,
    who: CurrentPrincipal,
    storage: StorageDirDep,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> DatasetPageOut:
    views = svc.list_for_team(db=db, principal=who, team=team, storage=storage)
    rows, more = paged(views, lambda v: (v.dataset.name,), limit, cursor)
    return DatasetPageOut(items=[_out(v, team) for v in rows], next_cursor=more)


@router.get("/{name}", response_model=DatasetOut, summary="One dataset")
def get_dataset(
    team: TeamPath, name: DatasetPath, db: SessionDep, who: CurrentPrincipal, storage: StorageDirDep
) -> DatasetOut:
    return _out(svc.get(db=db, principal=who, team=team, name=name, storage=storage), team)


@router.post(
    "",
    response_model=DatasetOut,
    status_code=status.HTTP_201_CREATED,
    responses=LOCATION,
    summary="Register a dataset (team-admin): a name for a directory of the storage's data area",
)
def register_dataset(
    team: TeamPath, body: DatasetIn, db: SessionDep, who: CurrentPrincipal, storage: StorageDirDep, response: Response
) -> DatasetOut:
    view = svc.register(
        db=db, principal=who, team=team, name=body.name, path=body.path, description=body.description, storage=storage
    )
    response.headers["Location"] = f"/v1/teams/{team}/datasets/{body.name}"
    return _out(view, team)


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove a dataset (team-admin; refused while a job that has not ended names it)",
)
def delete_dataset(team: TeamPath, name: DatasetPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    svc.remove(db=db, principal=who, team=team, name=name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
