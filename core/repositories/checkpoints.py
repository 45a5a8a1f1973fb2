"""A job's checkpoint rows: one per step, written by the worker's relay (a checkpoint its trainer committed, or the
one it resumed from) and by the scheduler's reconciliation of disk and rows (a verified checkpoint found on disk
without its row, ``core.orphan_checkpoints``). One writer function, so both record a checkpoint the same way."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Checkpoint


def steps_recorded(db: Session, job_id: int) -> set[int]:
    return set(db.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)))


def record(
    db: Session,
    *,
    job_id: int,
    step: int,
    attempt_id: int | None,
    path: str,
    size: int,
    sha256: str,
    verified: bool,
    created_at: datetime,
) -> Checkpoint:
    """The row of ``step``, created or replaced: a resumed attempt may commit the same step again (after a rollback
    or a lost relay), and the state on disk is then the newer one. ``sha256`` is the manifest's (it names every
    file's hash); ``size`` the sum of the files' sizes."""
    row = db.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)).first()
    if row is None:
        row = Checkpoint(job_id=job_id, step=step, path="", bytes=0, sha256="")
        db.add(row)
    row.attempt_id = attempt_id
    row.path = path[:1024]
    row.bytes = size
    row.sha256 = sha256[:64]
    row.verified = verified
    row.created_at = created_at
    return row
