"""A team's code archives: upload once by SHA-256, look up, list, download (docs/user-code.md)."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response, status
from fastapi.responses import FileResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentPrincipal, SessionDep, SettingsDep, StorageDirDep
from api.routers.common import ERRORS, PAGE_DEFAULT, CursorQuery, LimitQuery, TeamPath, paged_query
from api.schemas.common import NEXT_CURSOR_DOC, OutModel
from core.code_archive import DIGEST_PATTERN, artifact_path
from core.models import Artifact
from core.services import artifacts as svc

router = APIRouter(prefix="/v1/teams/{team}/artifacts", tags=["artifacts"], responses=ERRORS)
# The upload route streams its body to disk under its own limit (KILN_ARTIFACT_MAX_UPLOAD_BYTES) instead of the
# API's 256 KiB body limit (api.middleware.BodyLimitMiddleware lets it through).
UPLOAD_PATH = r"^/v1/teams/[^/]+/artifacts/[0-9a-f]{64}$"

DigestPath = Annotated[str, Path(pattern=DIGEST_PATTERN, description="SHA-256 of the archive (hex)")]


class ArtifactOut(OutModel):
    team: str
    digest: str
    bytes: int
    unpacked_bytes: int
    entries: int
    created_at: datetime
    last_used_at: datetime
    created: bool = False  # true only in the answer to the upload that stored it
    download: str  # the archive itself


def _out(a: Artifact, team: str, created: bool = False) -> ArtifactOut:
    return ArtifactOut(
        team=team,
        digest=a.digest,
        bytes=a.bytes,
        unpacked_bytes=a.unpacked_bytes,
        entries=a.entries,
        created_at=a.created_at,
        last_used_at=a.last_used_at,
        created=created,
        download=f"/v1/teams/{team}/artifacts/{a.digest}/archive",
    )


class ArtifactPageOut(OutModel):
    items: list[ArtifactOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


@router.get("", response_model=ArtifactPageOut, summary="The team's code archives, newest first")
def list_artifacts(
    team: TeamPath, db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> ArtifactPageOut:
    rows, more = paged_query(
        partial(svc.list_for_team, db=db, principal=who, team=team), lambda a: (-a.id,), (0,), limit, cursor
    )
    return ArtifactPageOut(items=[_out(a, team) for a in rows], next_cursor=more)


@router.get("/{digest}", response_model=ArtifactOut, summary="One archive (404: not uploaded yet)")
def get_artifact(team: TeamPath, digest: DigestPath, db: SessionDep, who: CurrentPrincipal) -> ArtifactOut:
    return _out(svc.get(db=db, principal=who, team=team, digest=digest), team)


@router.get(
    "/{digest}/archive",
    summary="Download the archive (.tar.gz)",
    responses={200: {"content": {"application/gzip": {}}}},
)
def download_artifact(
    team: TeamPath, digest: DigestPath, db: SessionDep, who: CurrentPrincipal, storage: StorageDirDep
) -> FileResponse:
    artifact = svc.get(db=db, principal=who, team=team, digest=digest)
    path = artifact_path(storage, artifact.team_id, digest)
    return FileResponse(path, media_type="application/gzip", filename=f"{team}-{digest[:12]}.tar.gz")


@router.put(
    "/{digest}",
    response_model=ArtifactOut,
    summary="Upload an archive (.tar.gz) under its SHA-256",
    responses={201: {"model": ArtifactOut}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_artifact(
    team: TeamPath,
    digest: DigestPath,
    request: Request,
    db: SessionDep,
    who: CurrentPrincipal,
    settings: SettingsDep,
    storage: StorageDirDep,
    response: Response,
) -> ArtifactOut:
    limit = settings.artifact_max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise svc.TooLarge(f"the archive is {declared} bytes; the limit is {limit}")
    # The body goes to a temporary file, hashed as it comes, while a thread checks the archive from that file as
    # it grows (core/services/artifacts.py, Upload): the check's verdict is ready about when the last byte is.
    upload = svc.Upload(storage, settings.archive_limits, limit)
    try:
        async for chunk in request.stream():
            upload.write(chunk)
        upload.complete()
        checked = await run_in_threadpool(upload.finish)
        stored = await run_in_threadpool(
            svc.store,
            db=db,
            principal=who,
            team=team,
            digest=digest,
            upload=upload.path,
            settings=settings,
            checked=checked,
        )
    finally:
        upload.abandon()  # a check still waiting for bytes ends; the file goes
    response.status_code = status.HTTP_201_CREATED if stored.created else status.HTTP_200_OK
    return _out(stored.artifact, team, stored.created)
