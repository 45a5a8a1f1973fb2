"""Checkpoint exports: a team member asks for a verified checkpoint's weights as safetensors; a worker converts
it (workers/exports.py runs ``python -m trainer.export``: torch is there, never in the API); the team downloads it.

Only the job's own team may request or download an export (admins included only as members): the weights are
the team's work. Requesting one is a write (a worker converts and stores a copy of the weights): its members and
team-admins, not its viewers (403, as for the team's other writes); its viewers read and download. An export is
kept under ``<storage>/exports/<job>/<step>/`` beside the checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Checkpoint, CheckpointExport, Job, Role
from core.repositories import jobs as jobs_repo
from core.services.errors import Conflict, Forbidden, NotFound
from core.services.principal import ROLE_RANK, Principal

FILES = ("model.safetensors", "manifest.json")
# A claim older than this is taken to be a crashed worker's, and is claimed again.
CLAIM_TIMEOUT = timedelta(minutes=15)


def export_dir(storage_dir: Path, job_id: int, step: int) -> Path:
    return storage_dir / "exports" / str(job_id) / str(step)


def _team_job(db: Session, principal: Principal, job_id: int, min_role: Role = Role.VIEWER) -> Job:
    """The job, when the caller has ``min_role`` or above in its team: NotFound outside the team (whatever the
    role there would be), Forbidden for a lower role."""
    job = jobs_repo.get(db, job_id)
    role = principal.roles.get(job.team_id) if job is not None else None
    if job is None or role is None:
        raise NotFound(f"job {job_id} not found (checkpoints are exported for the job's own team only)")
    if ROLE_RANK[role] < ROLE_RANK[min_role]:
        raise Forbidden(
            f"your role in job {job_id}'s team is {role}; exporting a checkpoint needs {min_role.value} or above"
        )
    return job


def request(*, db: Session, principal: Principal, job_id: int, step: int | None = None) -> CheckpointExport:
    """Queue an export of ``step`` (default: the job's latest verified checkpoint), or return the existing one;
    a failed export is queued again. A member's or team-admin's (``_team_job``)."""
    job = _team_job(db, principal, job_id, Role.MEMBER)
    stmt = select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.verified.is_(True))
    if step is not None:
        stmt = stmt.where(Checkpoint.step == step)
    checkpoint = db.scalars(stmt.order_by(Checkpoint.step.desc()).limit(1)).first()
    if checkpoint is None:
        raise NotFound(f"job {job_id} has no verified checkpoint" + (f" at step {step}" if step is not None else ""))
    existing = db.scalars(
        select(CheckpointExport).where(CheckpointExport.job_id == job.id, CheckpointExport.step == checkpoint.step)
    ).first()
    if existing is not None and existing.state != "failed":
        return existing
    if existing is None:
        existing = CheckpointExport(job_id=job.id, step=checkpoint.step)
        db.add(existing)
    existing.state, existing.error, existing.claimed_by, existing.claimed_at = "requested", None, None, None
    existing.requested_by_user_id, existing.requested_at = principal.user_id, utcnow()
    db.flush()
    return existing


def list_exports(*, db: Session, principal: Principal, job_id: int) -> Sequence[CheckpointExport]:
    job = _team_job(db, principal, job_id)
    return db.scalars(
        select(CheckpointExport).where(CheckpointExport.job_id == job.id).order_by(CheckpointExport.step)
    ).all()


def get(*, db: Session, principal: Principal, job_id: int, step: int) -> CheckpointExport:
    job = _team_job(db, principal, job_id)
    found = db.scalars(
        select(CheckpointExport).where(CheckpointExport.job_id == job.id, CheckpointExport.step == step)
    ).first()
    if found is None:
        raise NotFound(f"no export of job {job_id} at step {step}; request one first")
    return found


def file_path(*, db: Session, principal: Principal, job_id: int, step: int, name: str, storage_dir: Path) -> Path:
    """A file of a ready export, for download."""
    export = get(db=db, principal=principal, job_id=job_id, step=step)
    if name not in FILES:
        raise NotFound(f"an export has no file {name!r} (files: {', '.join(FILES)})")
    if export.state != "ready":
        raise Conflict(
            f"the export of job {job_id} at step {step} is {export.state}"
            + (f": {export.error}" if export.error else "")
        )
    path = export_dir(storage_dir, job_id, step) / name
    if not path.is_file():
        raise NotFound(f"the export's {name} is gone from storage; request the export again")
    return path


# ------------------------------------------------------------------------------------------- for the workers


def claim_next(db: Session, *, worker: str, now: datetime) -> tuple[CheckpointExport, Checkpoint] | None:
    """The oldest export waiting (or claimed by a worker that has been silent too long), claimed for ``worker``.
    On PostgreSQL two workers never claim the same one (SKIP LOCKED). The caller commits."""
    stale = now - CLAIM_TIMEOUT
    stmt = (
        select(CheckpointExport)
        .where(
            or_(
                CheckpointExport.state == "requested",
                (CheckpointExport.state == "running") & (CheckpointExport.claimed_at < stale),
            )
        )
        .order_by(CheckpointExport.id)
        .limit(1)
    )
    if db.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    export = db.scalars(stmt).first()
    if export is None:
        return None
    checkpoint = db.scalars(
        select(Checkpoint).where(Checkpoint.job_id == export.job_id, Checkpoint.step == export.step)
    ).first()
    if checkpoint is None:
        finish(db, export.id, error="the checkpoint is gone (pruned after the request)", now=now)
        return None
    export.state, export.claimed_by, export.claimed_at = "running", worker, now
    return export, checkpoint


def finish(
    db: Session,
    export_id: int,
    *,
    now: datetime,
    error: str | None = None,
    size: int | None = None,
    sha256: str | None = None,
) -> None:
    db.execute(
        update(CheckpointExport)
        .where(CheckpointExport.id == export_id)
        .values(
            state="failed" if error else "ready",
            error=error[:1024] if error else None,
            bytes=size,
            sha256=sha256,
            finished_at=now,
        )
    )
