"""A job's checkpoint rows: one per step, written by the worker's relay (a checkpoint its trainer committed, or the
one it resumed from) and by the scheduler's reconciliation of disk and rows (a verified checkpoint found on disk
without its row, ``core.orphan_checkpoints``). One writer function, so both record a checkpoint the same way.

The rows are the checkpoints the job holds: its trainer keeps the newest ``checkpointing.keep_last`` on disk and
deletes the older ones, so recording a checkpoint forgets the rows of those it deleted (a job with ``keep_last: 2``
listed 14 checkpoints, all "verified", with 2 on disk)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.models import Checkpoint
from core.spec import Checkpointing


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
    keep_last: int,
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
    db.flush()
    _forget_pruned(db, job_id, keep_last)
    return row


def keep_last(spec: Mapping[str, Any]) -> int:
    """How many checkpoints the job's trainer keeps on disk (its spec's ``checkpointing.keep_last``)."""
    value = (spec.get("checkpointing") or {}).get("keep_last")
    return int(value) if value else int(Checkpointing.model_fields["keep_last"].default)


def _forget_pruned(db: Session, job_id: int, keep_last: int) -> None:
    """The rows older than the newest ``keep_last``: the trainer deleted their checkpoints once it had a newer one
    (``trainer.checkpoint.checkpointer.Checkpointer.prune``, by the same rule)."""
    newest = select(Checkpoint.step).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc())
    oldest_kept = min(db.scalars(newest.limit(keep_last)), default=None)
    if oldest_kept is not None:
        db.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step < oldest_kept))
