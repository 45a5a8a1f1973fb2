"""Disk and database agree: what to do with a committed checkpoint found in a job's directory without its row.

A checkpoint's row comes from the worker's relay of its trainer's record, in the heartbeat that proves the worker
still holds the job. A trainer can commit while its worker cannot write that row: the database was away (the
record waits in the worker's memory), and the attempt was then declared lost before the worker's next heartbeat,
so the worker, fenced, relays nothing; or the worker died after the commit. The checkpoint is on disk, complete
and committed under a valid fence, and no list, export or scheduler decision knows it. Each one is settled here,
never ignored:

- **adopted** (``CHECKPOINT_ADOPTED``): it verifies against its manifest, and it was committed while its writer
  still held the job: the row the relay would have written (its step, size, manifest sha256, path and writer);
- **discarded** (``CHECKPOINT_DISCARDED``), deleted once the decision is committed: it verifies, but its writer
  had lost the job when it committed it (see ``lost_the_job_before``): a zombie's state, which the next restart
  must not resume from;
- **corrupt** (``CHECKPOINT_CORRUPT``, the event the trainer records when loading skips one): it does not verify;
  left on disk as loading leaves it (never resumed from, evidence kept), and never adopted.

The writer's checkpoints are left alone while it still holds the job: its relay records them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.checkpoint_files import MANIFEST, list_checkpoints, read_manifest, remove_checkpoint, sha256_file, verify
from core.event_types import EventType
from core.lifecycle import after_commit
from core.models import Attempt, Event, Job
from core.repositories import checkpoints as checkpoints_repo
from core.transitions import record_event

log = logging.getLogger(__name__)

ADOPTED = EventType.CHECKPOINT_ADOPTED
DISCARDED = EventType.CHECKPOINT_DISCARDED
CORRUPT = EventType.CHECKPOINT_CORRUPT


def reconcile_job(db: Session, *, job_id: int, root: Path, now: datetime) -> list[str]:
    """Settle every committed checkpoint under ``root`` (the job's durable checkpoint directory) that has no row;
    returns what it did, one line each. Deletions wait for the caller's commit. Raises OSError when the directory
    cannot be listed (the caller tries again later)."""
    on_disk = list_checkpoints(root)
    if not on_disk or not {s for s, _ in on_disk} - checkpoints_repo.steps_recorded(db, job_id):
        return []
    # Locked as the relay locks it, so that a worker writing a row of the same step waits for this decision.
    job = db.get(Job, job_id, with_for_update=True, populate_existing=True)
    if job is None:
        return []
    recorded = checkpoints_repo.steps_recorded(db, job_id)
    attempts = db.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.fencing_token)).all()
    actions: list[str] = []
    for step, path in on_disk:
        if step in recorded:
            continue
        try:
            actions += _settle(db, job=job, attempts=attempts, step=step, path=path, now=now)
        except FileNotFoundError:
            continue  # pruned (or rolled back over) while it was read
    return actions


def _settle(db: Session, *, job: Job, attempts: Sequence[Attempt], step: int, path: Path, now: datetime) -> list[str]:
    manifest = _manifest(path)
    writer = _writer(attempts, manifest)
    if writer is not None and right_ended_at(writer, attempts) is None:
        return []  # its writer still holds the job: the relay records it
    why_corrupt = verify(path)
    if why_corrupt is not None or manifest is None:
        return _corrupt(db, job=job, step=step, path=path, why=why_corrupt or "unreadable manifest", now=now)
    lost = lost_the_job_before(manifest, writer, attempts, step)
    if lost is not None:
        return _discard(db, job=job, step=step, path=path, why=lost, writer=writer, now=now)
    assert writer is not None
    return _adopt(db, job=job, step=step, path=path, manifest=manifest, writer=writer, now=now)


def _manifest(path: Path) -> dict[str, Any] | None:
    """None when it cannot be read as a manifest; FileNotFoundError when the checkpoint is gone."""
    if not path.is_dir():
        raise FileNotFoundError(path)
    try:
        return read_manifest(path)
    except (OSError, ValueError):
        return None


def _writer(attempts: Sequence[Attempt], manifest: dict[str, Any] | None) -> Attempt | None:
    token = (manifest or {}).get("fencing_token")
    return next((a for a in attempts if token is not None and a.fencing_token == token), None)


def right_ended_at(attempt: Attempt, attempts: Sequence[Attempt]) -> datetime | None:
    """When ``attempt`` stopped holding the job: when it ended, or when a newer attempt was admitted (the job's
    token moved on), whichever came first; None while it holds the job."""
    newer = [a.created_at for a in attempts if a.fencing_token > attempt.fencing_token]
    ends = [t for t in (attempt.ended_at, min(newer, default=None)) if t is not None]
    return min(ends, default=None)


def lost_the_job_before(
    manifest: dict[str, Any], writer: Attempt | None, attempts: Sequence[Attempt], step: int
) -> str | None:
    """Why the checkpoint was committed after its writer had lost the job (None: it had not), from what is recorded.

    The fence names the attempt that holds the job; the reconciler revokes it only after it has recorded the
    attempt's end, and the next attempt claims it after that. So a commit under a valid fence happened before the
    writer's right ended (``right_ended_at``); a commit after it is a zombie's: a trainer whose lease check or
    fence check passed before the end and whose rename came after (a frozen process, a hung storage call). Three
    records show it:

    - no attempt of the job holds the manifest's token: no fence kiln wrote ever named it;
    - the manifest was written (``created``, the writer's clock, taken before its lease and fence checks) after
      the writer's right ended. A legitimate commit passed a lease check that expires 10% of a lease before the
      database lease, and the reconciler declares the loss only after that: the margin the lease protocol already
      relies on for the clocks of the scheduler's and the workers' hosts;
    - a newer attempt resumed from an earlier step: choosing the newest verified checkpoint on disk, it would
      have taken this one had it been committed then; so it came later, and the job's state no longer comes
      from it either way.
    """
    if writer is None:
        return f"its manifest names fencing token {manifest.get('fencing_token')!r}, which no attempt of the job held"
    ended = right_ended_at(writer, attempts)
    created = _created(manifest)
    if ended is not None and created is not None and created > ended:
        return (
            f"written at {created.isoformat(timespec='milliseconds')}, after attempt {writer.number} had lost the "
            f"job at {ended.isoformat(timespec='milliseconds')}"
        )
    for later in attempts:
        resumed = later.resumed_from_step
        if later.fencing_token > writer.fencing_token and resumed is not None and resumed < step:
            return (
                f"attempt {later.number}, which took the job from attempt {writer.number}, resumed from step "
                f"{later.resumed_from_step}: this checkpoint was not on disk when it chose"
            )
    return None


def _created(manifest: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(manifest["created"]), UTC)
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return None


def _adopt(
    db: Session, *, job: Job, step: int, path: Path, manifest: dict[str, Any], writer: Attempt, now: datetime
) -> list[str]:
    files = manifest.get("files") or {}
    size = sum(int(f.get("bytes") or 0) for f in files.values() if isinstance(f, dict))
    checkpoints_repo.record(
        db,
        job_id=job.id,
        step=step,
        attempt_id=writer.id,
        path=str(path),
        size=size,
        sha256=sha256_file(path / MANIFEST),
        verified=True,
        created_at=_created(manifest) or now,
        keep_last=checkpoints_repo.keep_last(job.spec),
    )
    record_event(
        db,
        ADOPTED,
        job=job,
        now=now,
        message=f"checkpoint at step {step} ({size} bytes) found on disk without its row: committed by attempt "
        f"{writer.number} while it held the job, verified, adopted",
        data={
            "attempt": writer.number,
            "step": step,
            "bytes": size,
            "loss": manifest.get("loss"),
            "path": str(path),
            "token": writer.fencing_token,
            "verified": True,
        },
    )
    return [f"job {job.id}: adopted the checkpoint at step {step} (attempt {writer.number})"]


def _told(db: Session, *, job: Job, type_: str, path: Path) -> bool:
    """An event of ``type_`` already names this checkpoint (this job's; rare events, so few rows)."""
    told = db.scalars(select(Event.data).where(Event.job_id == job.id, Event.type == type_)).all()
    return any((data or {}).get("path") == str(path) for data in told)


def _discard(
    db: Session, *, job: Job, step: int, path: Path, why: str, writer: Attempt | None, now: datetime
) -> list[str]:
    manifest_sha = sha256_file(path / MANIFEST)
    # Deleted after the commit, unless a newer attempt has committed the same step over it by then.
    after_commit(db, _DELETE_KEY, (path, manifest_sha), _delete_discarded)
    if _told(db, job=job, type_=DISCARDED, path=path):
        return []  # said once already; its deletion had failed and is tried again
    record_event(
        db,
        DISCARDED,
        job=job,
        now=now,
        message=f"checkpoint at step {step} found on disk without its row, committed after its writer lost the "
        f"job: {why}; deleted",
        data={"step": step, "path": str(path), "reason": why, "attempt": writer.number if writer else None},
    )
    return [f"job {job.id}: discarded the checkpoint at step {step} ({why})"]


def _corrupt(db: Session, *, job: Job, step: int, path: Path, why: str, now: datetime) -> list[str]:
    """Once per checkpoint: a later scan finds the event (the trainer's or ours) and says nothing more."""
    if _told(db, job=job, type_=CORRUPT, path=path):
        return []
    record_event(
        db,
        CORRUPT,
        job=job,
        now=now,
        message=f"checkpoint {path.name} found on disk without its row does not verify ({why}): never resumed "
        "from nor recorded",
        data={"step": step, "path": str(path), "reason": why, "tier": "durable"},
    )
    return [f"job {job.id}: checkpoint at step {step} is corrupt ({why})"]


_DELETE_KEY = "kiln.discard_checkpoints"


def _delete_discarded(items: list[Any]) -> None:
    """After the commit: delete each discarded checkpoint unless the directory now holds another one (a newer
    attempt that reached the same step commits over it: its manifest differs)."""
    for path, manifest_sha in items:
        try:
            if sha256_file(path / MANIFEST) == manifest_sha:
                remove_checkpoint(path)
        except OSError:  # gone already, or storage unreachable from here: the next scan tries again
            log.warning("could not delete the discarded checkpoint %s", path, exc_info=True)
