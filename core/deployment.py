"""Which kiln database this is, and the storage directory it claims.

A job's number is unique within one database only: a database recreated (or a second kiln on the same host)
numbers its jobs from 1 again. Whatever outlives a database or is shared by several must not be found by a job's
number alone, or a new job 1 resumes from an old job 1's checkpoint, reads its logs or loads its compiled code:

* a host's fast local checkpoint tier (``/dev/shm/kiln`` by default) is shared by every kiln on the host: each
  database keeps its jobs under its own uid there (``workers.attempt_env.local_tier_dir``);
* a storage directory (checkpoints, logs, compile caches, code) belongs to the database that first used it: it
  names that database's uid in ``DEPLOYMENT``, and a process of another database refuses to start on it, as a
  Kafka broker refuses log directories of another cluster id.

The uid is the one row of ``deployment``, written by migration 0009.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Deployment

MARKER = "DEPLOYMENT"


class StorageOfAnotherDeployment(RuntimeError):
    """The storage directory was claimed by another kiln database."""


def deployment_uid(db: Session) -> str:
    uid = db.scalar(select(Deployment.uid).where(Deployment.id == 1))
    if uid is None:
        raise RuntimeError("the database has no deployment row: upgrade it first (kiln migrate)")
    return uid


def claim_storage(storage_dir: Path, uid: str) -> None:
    """Name ``uid`` in ``storage_dir`` if nothing does yet; raise if another deployment's uid is there.

    The marker is written whole beside it and then hard-linked into place, which fails if it exists: two processes
    starting at once on a new directory agree, and a crash leaves no half-written marker."""
    storage_dir.mkdir(parents=True, exist_ok=True)
    marker = storage_dir / MARKER
    if not marker.exists():
        tmp = storage_dir / f".{MARKER}.{os.getpid()}"
        tmp.write_text(uid + "\n")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.link(tmp, marker)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    claimed = marker.read_text().strip()
    if claimed != uid:
        raise StorageOfAnotherDeployment(
            f"the storage directory {storage_dir} belongs to another kiln database (deployment {claimed}; this "
            f"database is {uid}): its jobs' checkpoints, logs and compile caches would be taken for this database's "
            "jobs of the same numbers. Point KILN_STORAGE_DIR at a new directory, or the database URL at the "
            f"database that owns it; delete {marker} only if that database is gone and its files may be reused."
        )


def local_tier_jobs(tier_dir: Path, uid: str) -> Path:
    """This database's jobs' directories in a host's fast local checkpoint tier, each under the job's number."""
    return tier_dir.resolve() / uid / "jobs"


def check_storage(db: Session, storage_dir: Path) -> None:
    """At a process's start (kiln up, API, scheduler, worker): ``storage_dir`` is this database's, or it raises."""
    claim_storage(storage_dir, deployment_uid(db))
