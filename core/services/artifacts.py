"""Artifacts: the archives of a team's own code, stored once per team by SHA-256 (docs/user-code.md).

A member uploads; anyone in the team reads. An upload is refused (nothing kept) when it is over the per-upload
limit, would take the team over its storage quota, does not match its digest, or breaks an archive rule
(``core.code_archive``). The file is written only under the artifact store: first to ``artifacts/tmp``, then,
checked, renamed into the team's directory. Archives no active job names are collected once their last use is
older than ``artifact_retention_s`` (``collect``, from the scheduler's leader).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.code_archive import ArchiveError, artifact_path, check, sha256_of
from core.db import utcnow
from core.models import Artifact, Job, Role
from core.repositories import teams as teams_repo
from core.repositories.keyset import Window, page
from core.services.errors import InvalidInput, NotFound, ServiceError
from core.services.principal import Principal, require_team
from core.settings import Settings
from core.states import ACTIVE


class TooLarge(ServiceError):
    """Over a size limit or a storage quota (HTTP 413)."""


@dataclass(frozen=True)
class Stored:
    artifact: Artifact
    created: bool  # False: the team already had this archive; nothing new was kept


def tmp_dir(storage: Path) -> Path:
    path = storage / "artifacts" / "tmp"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _team_id(db: Session, principal: Principal, team: str, role: Role) -> int:
    return require_team(principal, teams_repo.get_by_name(db, team), team, role).id


def get(*, db: Session, principal: Principal, team: str, digest: str) -> Artifact:
    team_id = _team_id(db, principal, team, Role.VIEWER)
    artifact = db.scalar(select(Artifact).where(Artifact.team_id == team_id, Artifact.digest == digest))
    if artifact is None:
        raise NotFound(f"no archive {digest[:12]} in team {team!r}")
    return artifact


def list_for_team(*, db: Session, principal: Principal, team: str, window: Window | None = None) -> list[Artifact]:
    """Newest first."""
    team_id = _team_id(db, principal, team, Role.VIEWER)
    return list(db.scalars(page(select(Artifact).where(Artifact.team_id == team_id), [(Artifact.id, True)], window)))


def team_usage(db: Session, team_id: int) -> int:
    return int(db.scalar(select(func.coalesce(func.sum(Artifact.bytes), 0)).where(Artifact.team_id == team_id)) or 0)


def store(*, db: Session, principal: Principal, team: str, digest: str, upload: Path, settings: Settings) -> Stored:
    """Keep the uploaded file ``upload`` (in ``tmp_dir``) as the team's archive ``digest``; ``upload`` is gone
    afterwards whatever happens."""
    try:
        team_id = _team_id(db, principal, team, Role.MEMBER)
        existing = db.scalar(select(Artifact).where(Artifact.team_id == team_id, Artifact.digest == digest))
        if existing is not None:
            existing.last_used_at = utcnow()
            return Stored(existing, created=False)
        size = upload.stat().st_size
        if size > settings.artifact_max_upload_bytes:
            raise TooLarge(f"the archive is {size} bytes; the limit is {settings.artifact_max_upload_bytes}")
        used = team_usage(db, team_id)
        if used + size > settings.artifact_team_quota_bytes:
            raise TooLarge(
                f"team {team!r} stores {used} bytes of code; {size} more would pass its quota of "
                f"{settings.artifact_team_quota_bytes} bytes (unused archives are collected after "
                f"{settings.artifact_retention_s:.0f} s)"
            )
        actual = sha256_of(upload)
        if actual != digest:
            raise InvalidInput.at("digest", f"the body's SHA-256 is {actual}, not {digest}")
        try:
            summary = check(upload, settings.archive_limits)
        except ArchiveError as exc:
            raise InvalidInput.at("archive", str(exc), "archive") from None
        final = artifact_path(settings.resolved_storage_dir, team_id, digest)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(upload, final)
        now = utcnow()
        artifact = Artifact(
            team_id=team_id,
            digest=digest,
            bytes=size,
            unpacked_bytes=summary.unpacked_bytes,
            entries=summary.entries,
            uploaded_by_user_id=principal.user_id,
            created_at=now,
            last_used_at=now,
        )
        db.add(artifact)
        db.flush()
        return Stored(artifact, created=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            upload.unlink()


def use(db: Session, *, team_id: int, digest: str, loc: str = "code.digest") -> Artifact:
    """At submit: the team's archive named by a spec (refused when the team has none by that digest)."""
    artifact = db.scalar(select(Artifact).where(Artifact.team_id == team_id, Artifact.digest == digest))
    if artifact is None:
        raise InvalidInput.at(loc, f"team has no uploaded code {digest[:12]}: upload it with kiln submit --workdir")
    artifact.last_used_at = utcnow()
    return artifact


def collect(db: Session, *, storage: Path, now: datetime | None = None, retention_s: float) -> list[Path]:
    """Delete the rows of archives no active job names whose last use is older than ``retention_s``; returns the
    files to remove once the caller has committed (a rolled-back collection leaves every file in place)."""
    cutoff = (now or utcnow()) - timedelta(seconds=retention_s)
    in_use = select(Job.id).where(
        Job.team_id == Artifact.team_id, Job.code_digest == Artifact.digest, Job.state.in_([s.value for s in ACTIVE])
    )
    stale = list(db.scalars(select(Artifact).where(Artifact.last_used_at < cutoff, ~in_use.exists())))
    files = [artifact_path(storage, a.team_id, a.digest) for a in stale]
    for artifact in stale:
        db.delete(artifact)
    return files


def remove_files(files: list[Path]) -> None:
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
