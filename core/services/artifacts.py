"""Artifacts: the archives of a team's own code, stored once per team by SHA-256 (docs/user-code.md).

A member uploads; anyone in the team reads. An upload is refused (nothing kept) when it is over the per-upload
limit, would take the team over its storage quota, does not match its digest, or breaks an archive rule
(``core.code_archive``). The file is written only under the artifact store: first to ``artifacts/tmp``, then,
checked, renamed into the team's directory. While the API receives it (``Upload``) the body is hashed as it comes
and checked by a thread that reads the file as it grows, so the verdict is ready about when the last byte is.
Archives no active job names are collected once their last use is older than ``artifact_retention_s``
(``collect``, from the scheduler's leader).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.code_archive import ArchiveError, ArchiveLimits, ArchiveSummary, artifact_path, check, check_stream, sha256_of
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


@dataclass(frozen=True)
class Checked:
    """What ``Upload`` learnt of a body while it arrived: its SHA-256 and the archive check's verdict."""

    sha256: str
    summary: ArchiveSummary | None  # None: refused, for ``error``
    error: str = ""


def tmp_dir(storage: Path) -> Path:
    path = storage / "artifacts" / "tmp"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


# Checks that read an upload while it arrives, per API process: each holds a thread of its own (never one of the
# server's pool, which a slow client would otherwise hold); uploads beyond them are checked once received.
_EARLY_CHECKS = threading.BoundedSemaphore(4)


class Upload:
    """A body being received into ``tmp_dir``: ``write`` each chunk (over ``max_bytes``: TooLarge), ``complete``
    at its end, then ``finish`` (blocking: in a thread) for its hash and the archive check's verdict. Meanwhile a
    thread of its own checks the archive from the file as it grows, waiting for the bytes that have not arrived,
    so the verdict is ready about when the last byte is (``_EARLY_CHECKS`` of them at once; an upload beyond is
    checked in ``finish``). ``abandon`` ends a check still waiting and removes the file."""

    def __init__(self, storage: Path, limits: ArchiveLimits, max_bytes: int) -> None:
        fd, name = tempfile.mkstemp(dir=tmp_dir(storage), prefix="upload-")
        self.path = Path(name)
        self.size = 0
        self._out = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._limits = limits
        self._max = max_bytes
        self._cond = threading.Condition()
        self._state = "receiving"  # then "complete" or "abandoned"
        self._pos = 0  # the checker's, in the file
        self._read_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)  # the check's, closed by it
        self._checking = False
        self._verdict: ArchiveSummary | ArchiveError | None = None
        self._failure: BaseException | None = None  # a check that failed otherwise (a bug): raised by finish
        self._checker: threading.Thread | None = None
        if _EARLY_CHECKS.acquire(blocking=False):
            self._checker = threading.Thread(target=self._check_early, name="archive-check", daemon=True)
            self._checker.start()

    def write(self, chunk: bytes) -> None:
        if self.size + len(chunk) > self._max:
            raise TooLarge(f"the archive is over the limit of {self._max} bytes")
        self._out.write(chunk)
        self._out.flush()
        self._hash.update(chunk)
        with self._cond:
            self.size += len(chunk)
            self._cond.notify_all()

    def complete(self) -> None:
        self._out.close()
        with self._cond:
            self._state = "complete"
            self._cond.notify_all()

    def finish(self) -> Checked:
        """After ``complete``: the body's SHA-256 and the check's verdict (waiting for the check, bounded)."""
        if self._checker is not None:
            self._checker.join()
            if self._failure is not None:
                raise self._failure
        else:
            self._verdict = self._check()
        digest = self._hash.hexdigest()
        if isinstance(self._verdict, ArchiveSummary):
            return Checked(sha256=digest, summary=self._verdict)
        return Checked(sha256=digest, summary=None, error=str(self._verdict))

    def abandon(self) -> None:
        with self._cond:
            if self._state == "receiving":
                self._state = "abandoned"
            if not self._checking and self._read_fd >= 0:  # no check began: none will
                os.close(self._read_fd)
                self._read_fd = -1
            self._cond.notify_all()
        self._out.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def read(self, n: int) -> bytes:
        """The checker's read: what has arrived past its position (waiting for some); b"" once all is read."""
        with self._cond:
            while self._pos >= self.size and self._state == "receiving":
                self._cond.wait()
            if self._state == "abandoned":
                raise ArchiveError("the upload ended before the archive did")
            available = self.size - self._pos
        data = os.pread(self._read_fd, min(n, available), self._pos) if available > 0 else b""
        self._pos += len(data)
        return data

    def _check(self) -> ArchiveSummary | ArchiveError:
        with self._cond:
            if self._read_fd < 0:
                return ArchiveError("the upload ended before the archive did")
            self._checking = True
        try:
            return check_stream(self, self._limits)
        except ArchiveError as exc:
            return exc
        finally:
            os.close(self._read_fd)

    def _check_early(self) -> None:
        try:
            self._verdict = self._check()
        except BaseException as exc:
            self._failure = exc
        finally:
            _EARLY_CHECKS.release()


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


def store(
    *,
    db: Session,
    principal: Principal,
    team: str,
    digest: str,
    upload: Path,
    settings: Settings,
    checked: Checked | None = None,
) -> Stored:
    """Keep the uploaded file ``upload`` (in ``tmp_dir``) as the team's archive ``digest``; ``upload`` is gone
    afterwards whatever happens. ``checked``: its hash and check, made while it arrived (``Upload``); else both
    are made here."""
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
        actual = checked.sha256 if checked is not None else sha256_of(upload)
        if actual != digest:
            raise InvalidInput.at("digest", f"the body's SHA-256 is {actual}, not {digest}")
        if checked is not None:
            if checked.summary is None:
                raise InvalidInput.at("archive", checked.error, "archive")
            summary = checked.summary
        else:
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
