"""Checkpoint exports: request (a worker converts the weights to safetensors), follow, download. The job's team
only (core/services/exports.py): its members and team-admins request, any of its roles reads."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response, status
from fastapi.responses import FileResponse
from pydantic import Field

from api.deps import CurrentPrincipal, SessionDep, StorageDirDep
from api.routers.common import ERRORS, PAGE_DEFAULT, CursorQuery, JobIdPath, LimitQuery, paged
from api.schemas.common import INT32, NEXT_CURSOR_DOC, InModel, OutModel
from core.models import CheckpointExport
from core.services import exports as svc

router = APIRouter(prefix="/v1/jobs/{job_id}/exports", tags=["exports"], responses=ERRORS)

StepPath = Annotated[int, Path(ge=0, le=INT32, description="The checkpoint's step")]
FilePath = Annotated[Literal["model.safetensors", "manifest.json"], Path(description="Which file of the export")]


class ExportIn(InModel):
    step: int | None = Field(default=None, ge=0, le=INT32, description="Default: the latest verified checkpoint.")


class ExportOut(OutModel):
    job_id: int
    step: int
    state: Literal["requested", "running", "ready", "failed"]
    requested_at: datetime
    finished_at: datetime | None
    bytes: int | None
    sha256: str | None
    error: str | None
    files: list[str] = Field(description="Download paths, once ready.")


def export_out(e: CheckpointExport) -> ExportOut:
    files = [f"/v1/jobs/{e.job_id}/exports/{e.step}/{name}" for name in svc.FILES] if e.state == "ready" else []
    return ExportOut(
        job_id=e.job_id,
        step=e.step,
        state=e.state,  # type: ignore[arg-type]
        requested_at=e.requested_at,
        finished_at=e.finished_at,
        bytes=e.bytes,
        sha256=e.sha256,
        error=e.error,
        files=files,
    )


@router.post(
    "",
    response_model=ExportOut,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Export a checkpoint's weights as safetensors (the job's team's members)",
    responses={200: {"model": ExportOut, "description": "Already exported"}},
)
def request_export(
    job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal, response: Response, body: ExportIn | None = None
) -> ExportOut:
    export = svc.request(db=db, principal=who, job_id=job_id, step=body.step if body else None)
    if export.state == "ready":
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{job_id}/exports/{export.step}"
    return export_out(export)


class ExportPageOut(OutModel):
    items: list[ExportOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


@router.get("", response_model=ExportPageOut, summary="The job's exports, by step")
def list_exports(
    job_id: JobIdPath,
    db: SessionDep,
    who: CurrentPrincipal,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> ExportPageOut:
    rows, more = paged(svc.list_exports(db=db, principal=who, job_id=job_id), lambda e: (e.step,), limit, cursor)
    return ExportPageOut(items=[export_out(e) for e in rows], next_cursor=more)


@router.get("/{step}", response_model=ExportOut, summary="One export")
def get_export(job_id: JobIdPath, step: StepPath, db: SessionDep, who: CurrentPrincipal) -> ExportOut:
    return export_out(svc.get(db=db, principal=who, job_id=job_id, step=step))


@router.get(
    "/{step}/{name}",
    response_class=FileResponse,
    summary="Download a file of a ready export",
    responses={200: {"content": {"application/octet-stream": {}, "application/json": {}}}},
)
def download(
    job_id: JobIdPath, step: StepPath, name: FilePath, db: SessionDep, who: CurrentPrincipal, storage: StorageDirDep
) -> FileResponse:
    path = svc.file_path(db=db, principal=who, job_id=job_id, step=step, name=name, storage_dir=storage)
    media = "application/json" if name.endswith(".json") else "application/octet-stream"
    return FileResponse(path, media_type=media, filename=f"job{job_id}-step{step}-{name}")
