"""Write a cycle's decisions in the caller's transaction (it commits); dispatch only after that commit.

Each admission bumps the job's fencing token and creates the attempt that carries it, so a worker holding an
older token can no longer act. Jobs are locked (``FOR UPDATE``) and re-checked: a job cancelled, held or changed
since the snapshot is skipped, never overwritten. Pending reasons are written only when they change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Attempt, Job
from core.states import AttemptState, JobState
from core.transitions import record_event, transition
from scheduler.policy.decisions import Admission, Decisions
from scheduler.policy.sharing import describe

log = logging.getLogger(__name__)

Dispatch = tuple[int, int, list[dict[str, Any]]]  # (attempt id, fencing token, placement)


@dataclass
class Applied:
    dispatches: list[Dispatch] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    reasons_written: int = 0


def _locked(db: Session, ids: list[int]) -> dict[int, Job]:
    if not ids:
        return {}
    stmt = select(Job).where(Job.id.in_(sorted(set(ids)))).order_by(Job.id).with_for_update()
    return {j.id: j for j in db.scalars(stmt)}


def apply_all(*, db: Session, decisions: Decisions, now: datetime) -> Applied:
    """Apply ``decisions``; ``dispatches`` are sent by the caller once it has committed."""
    out = Applied()
    ids = [a.job_id for a in decisions.admissions] + [p.job_id for p in decisions.preemptions]
    ids += [f.job_id for f in decisions.failures] + [k.job_id for k in decisions.time_limit_kills]
    jobs = _locked(db, ids)
    numbers = _next_attempt_numbers(db, [a.job_id for a in decisions.admissions])
    for adm in decisions.admissions:
        job = jobs.get(adm.job_id)
        if job is None or job.state != JobState.QUEUED or job.cancel_requested or job.held_at is not None:
            continue  # cancelled, held or changed since the snapshot
        job.fencing_token += 1
        placement = [p.as_json() for p in adm.placement]
        attempt = Attempt(
            job_id=job.id,
            number=numbers.get(job.id, 1),
            fencing_token=job.fencing_token,
            placement=placement,
            state=AttemptState.PENDING.value,
            created_at=now,
        )
        db.add(attempt)
        job.preempt_requested = False
        job.not_before = None
        hosts = ", ".join(p["host"] for p in placement)  # type: ignore[misc]
        transition(
            db,
            job,
            JobState.ADMITTED,
            message=f"admitted on {hosts}" + (" (backfill)" if adm.backfilled else "") + _shared(adm),
            data={"placement": placement, "fencing_token": job.fencing_token, "backfilled": adm.backfilled},
            now=now,
        )
        db.flush([attempt])
        out.dispatches.append((attempt.id, job.fencing_token, placement))
        out.admitted.append(job.id)
    for pre in decisions.preemptions:
        job = jobs.get(pre.job_id)
        if job is None or job.state != JobState.RUNNING or job.preempt_requested:
            continue
        job.preempt_requested = True
        transition(
            db,
            job,
            JobState.PREEMPTING,
            message=pre.reason,
            data={"preemptor": pre.preemptor_id, "reason": pre.reason},
            now=now,
        )
        out.preempted.append(job.id)
    for fail in decisions.failures:
        job = jobs.get(fail.job_id)
        if job is None or job.state != JobState.QUEUED or job.held_at is not None:
            continue
        job.exit_reason = fail.message[:512]
        transition(db, job, JobState.FAILED, message=fail.message, now=now)
        out.failed.append(job.id)
    for kill in decisions.time_limit_kills:
        job = jobs.get(kill.job_id)
        if job is None or job.state != JobState.RUNNING or job.cancel_requested:
            continue
        job.cancel_requested = True
        job.exit_reason = kill.message[:512]
        record_event(db, EventType.TIME_LIMIT, job=job, message=kill.message)
        out.killed.append(job.id)
    out.reasons_written = _write_reasons(db, decisions, now)
    return out


def _shared(adm: Admission) -> str:
    share = adm.placement[0].share if adm.placement else None
    return f", sharing GPU {adm.placement[0].gpus[0]}: {describe(share)}" if share is not None else ""


def _next_attempt_numbers(db: Session, job_ids: list[int]) -> dict[int, int]:
    if not job_ids:
        return {}
    stmt = select(Attempt.job_id, func.max(Attempt.number)).where(Attempt.job_id.in_(job_ids)).group_by(Attempt.job_id)
    return {jid: (n or 0) + 1 for jid, n in db.execute(stmt).tuples()}


def _write_reasons(db: Session, decisions: Decisions, now: datetime) -> int:
    wanted = {p.job_id: (p.reason.value, p.message[:512]) for p in decisions.pending}
    if not wanted:
        return 0
    # Compare with what is stored and touch only the rows that change (no write storm on a quiet queue).
    stmt = select(Job.id, Job.pending_reason, Job.pending_message).where(
        Job.id.in_(sorted(wanted)), Job.state == JobState.QUEUED.value, Job.held_at.is_(None)
    )  # a job held since the snapshot keeps the reason its hold wrote
    changed = [jid for jid, reason, message in db.execute(stmt).tuples() if (reason, message) != wanted[jid]]
    if not changed:
        return 0
    for job in db.scalars(select(Job).where(Job.id.in_(changed)).order_by(Job.id)):
        reason, message = wanted[job.id]
        if job.pending_reason != reason:
            record_event(db, EventType.PENDING, job=job, message=f"{reason}: {message}", data={"reason": reason})
        job.pending_reason = reason
        job.pending_message = message
        job.updated_at = now
    return len(changed)
