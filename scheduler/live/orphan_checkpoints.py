"""Which jobs' checkpoint directories the reconciler compares with their rows, and when (the rule itself:
``core.orphan_checkpoints``).

A checkpoint can lack its row only once its writer stopped holding the job: until then its worker's relay keeps
the record and writes it at the next heartbeat that reaches the database. So a job's directory is worth a look
when one of its attempts has just ended - whoever ended it: its worker's report, the reconciler declaring it
lost, a restarted worker - and at no other time: a pass lists the directories of the jobs whose attempts ended
since the last pass, never every job's (the cycle runs every second or two over thousands of jobs). What a
zombie commits after its attempt ended is found at the job's next attempt end, which every unfinished job has.

Cost per pass: one query of the attempts ended since the previous pass (the scan of ``attempts`` that the
reconciler's own lease query makes too), then one directory listing per such job; a checkpoint's manifest is
read, and its files hashed, only when it has no row and its writer no longer holds the job - the rare case.
At most ``MAX_JOBS_PER_PASS`` jobs a pass: after a scheduler start the last day's ends are caught up over
several passes instead of one long one.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.fence import job_checkpoint_dir
from core.lifecycle import after_commit
from core.models import Attempt
from core.orphan_checkpoints import reconcile_job
from core.settings import Settings

log = logging.getLogger(__name__)

MAX_JOBS_PER_PASS = 20
# A scheduler that starts (or takes the lead) looks this far back: it cannot know which ends its predecessor saw.
# Checkpoint rows matter for as long as anyone lists, exports or resumes a job, which is mostly within a day.
FIRST_LOOK_BACK = timedelta(days=1)


@dataclass
class _Scans:
    """What one engine's passes have looked at: attempt ends before ``floor`` are done; those after it that are in
    ``seen`` (attempt id -> when it ended) too."""

    floor: datetime | None = None
    seen: dict[int, datetime] = field(default_factory=dict)


_SCANS: weakref.WeakKeyDictionary[Engine, _Scans] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _scans(db: Session) -> _Scans:
    bind = db.get_bind()
    engine: Engine = bind if isinstance(bind, Engine) else bind.engine
    with _LOCK:
        return _SCANS.setdefault(engine, _Scans())


def reset_scans() -> None:
    """Forget what every engine's passes looked at (tests)."""
    with _LOCK:
        _SCANS.clear()


def reconcile_checkpoints(db: Session, now: datetime, settings: Settings) -> list[str]:
    """Compare the checkpoint directories of the jobs whose attempts ended since the last pass with their rows;
    returns what it did, one line each. Reads and writes through ``db`` only; deletions and this pass's progress
    take effect after the caller's commit (a rolled-back pass is done again)."""
    scans = _scans(db)
    floor = scans.floor or now - FIRST_LOOK_BACK
    # An end is stamped by whoever ends the attempt before its transaction commits, on that host's clock: one lease
    # covers a transaction held open up to the idle-in-transaction timeout (half a lease) and the clocks' skew.
    settle = timedelta(seconds=settings.lease_s)
    ended = db.execute(
        select(Attempt.id, Attempt.job_id, Attempt.ended_at)
        .where(Attempt.ended_at > floor - settle)
        .order_by(Attempt.ended_at, Attempt.id)
    ).tuples()
    fresh = [(a, j, t) for a, j, t in ended if t is not None and a not in scans.seen]
    jobs: list[int] = []
    for _, job_id, _ in fresh:
        if job_id not in jobs and len(jobs) < MAX_JOBS_PER_PASS:
            jobs.append(job_id)
    actions: list[str] = []
    for job_id in jobs:
        root = job_checkpoint_dir(settings.resolved_storage_dir, job_id)
        try:
            actions += reconcile_job(db, job_id=job_id, root=root, now=now)
        except OSError as exc:
            # The storage failed under this host (a directory that is not there is no error: a scheduler without
            # the storage mounted lists nothing). Not retried pass after pass, which would starve the other jobs:
            # the job's next attempt end looks again.
            log.warning("could not compare job %s's checkpoints with their rows: %s", job_id, exc)
    done = {a: t for a, j, t in fresh if j in jobs}
    left = [t for a, j, t in fresh if a not in done]
    next_floor = min([now, *left])
    after_commit(db, _PROGRESS_KEY, (scans, next_floor, done, settle), _advance)
    return actions


_PROGRESS_KEY = "kiln.checkpoint_scans"


def _advance(items: list[tuple[_Scans, datetime, dict[int, datetime], timedelta]]) -> None:
    for scans, floor, done, settle in items:
        with _LOCK:
            scans.floor = floor
            scans.seen.update(done)
            for attempt_id in [a for a, t in scans.seen.items() if t <= floor - settle]:
                del scans.seen[attempt_id]  # below the next query's bound: never selected again
