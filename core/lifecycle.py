"""How an attempt ends and what its job does next: the one place the workers and the scheduler's reconciler both
call to end an attempt, requeue a job after a failure, count restarts and wait out a backoff.

``EXIT_CLASS_ENDS`` is the whole rule as data: how an attempt ended (its ``ExitClass``) decides the attempt's
final state, the job's next state and whether the job goes back to the queue. Only infrastructure failures count
as restarts; a user error or an OOM would fail again the same way, so it fails the job.

Nothing here commits; fence revocations run only after the caller's commit (a session ``after_commit`` hook).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from core.fence import job_checkpoint_dir, revoke_fence
from core.models import Attempt, Event, Job, Usage
from core.repositories import jobs as jobs_repo
from core.repositories import step_times
from core.settings import Settings, Timings
from core.states import AttemptState, JobState, Reason
from core.transitions import move_attempt, record_event, transition

log = logging.getLogger(__name__)

DEFAULT_MAX_RESTARTS = 3
DEFAULT_RECOVERY_OBJECTIVE_S = 300.0


class ExitClass(enum.StrEnum):
    """How an attempt ended, as its worker classified it (``workers.exit_classes.classify``)."""

    SUCCEEDED = "succeeded"
    USER_ERROR = "user_error"
    INFRASTRUCTURE = "infrastructure"  # crash, signal, lost node: retry elsewhere (restart_count += 1)
    PREEMPTED = "preempted"  # asked by the scheduler: requeue with progress, no restart counted
    CANCELLED = "cancelled"
    OOM = "oom"
    NCCL_ERROR = "nccl_error"  # retried like infrastructure: a link or a peer failed, not the job
    TIMEOUT = "timeout"  # spec.time_limit_s
    FENCED = "fenced"  # another attempt owns the job; this one may not change its state
    DRAINED = "drained"  # the worker shut down gracefully: requeue with progress, no restart counted


class Requeue(enum.StrEnum):
    NO = "no"  # the job ends with the attempt
    KEEP_PROGRESS = "keep_progress"  # back in the queue from its checkpoint; not a restart
    RESTART = "restart"  # LOST, then back in the queue with a restart counted and a backoff (FAILED past the limit)


@dataclass(frozen=True)
class AttemptEnd:
    attempt: AttemptState
    job: JobState  # the job's state right after the attempt (LOST: then QUEUED or FAILED, see requeue_after_failure)
    requeue: Requeue
    pending_reason: Reason | None = None


_FAILED = AttemptEnd(AttemptState.FAILED, JobState.FAILED, Requeue.NO)
_LOST = AttemptEnd(AttemptState.LOST, JobState.LOST, Requeue.RESTART)

EXIT_CLASS_ENDS: dict[ExitClass, AttemptEnd] = {
    ExitClass.SUCCEEDED: AttemptEnd(AttemptState.SUCCEEDED, JobState.SUCCEEDED, Requeue.NO),
    ExitClass.CANCELLED: AttemptEnd(AttemptState.CANCELLED, JobState.CANCELLED, Requeue.NO),
    ExitClass.PREEMPTED: AttemptEnd(AttemptState.PREEMPTED, JobState.QUEUED, Requeue.KEEP_PROGRESS, Reason.PREEMPTED),
    ExitClass.DRAINED: AttemptEnd(AttemptState.DRAINED, JobState.QUEUED, Requeue.KEEP_PROGRESS, Reason.DRAINED),
    ExitClass.USER_ERROR: _FAILED,
    ExitClass.OOM: _FAILED,
    ExitClass.TIMEOUT: _FAILED,
    ExitClass.INFRASTRUCTURE: _LOST,
    ExitClass.NCCL_ERROR: _LOST,
    # FENCED by the fence file while the database still gives this attempt the job (a fence that lost its token
    # some other way): the job must run again. (A worker that lost the job in the database ends only its own
    # attempt, FENCED, and touches the job not at all.)
    ExitClass.FENCED: _LOST,
}


# ------------------------------------------------------------------------------------------------------ leases


def renew_lease(attempt: Attempt, *, node_rank: int, now: datetime, lease_s: float) -> None:
    """The lease of one node of an attempt, renewed by that node's worker (at its claim and each heartbeat).

    A gang's attempt lives only while every node it started lives: each claimed node keeps its own lease in the
    placement, and the attempt's lease is the earliest of them. Otherwise a host that froze (or lost its network)
    would leave its gang RUNNING for as long as the other hosts' workers renewed the one lease, their ranks blocked
    in a collective with a peer that never answers (gloo and NCCL wait 10 minutes before they give up)."""
    attempt.heartbeat_at = now
    expires = now + timedelta(seconds=lease_s)
    placement = attempt.placement or []
    if len(placement) <= 1:
        attempt.lease_expires_at = expires
        return
    nodes = [dict(n) for n in placement]
    nodes[node_rank]["lease_expires_at"] = expires.isoformat()
    attempt.placement = nodes  # a new list, so the JSON column is written
    attempt.lease_expires_at = min(
        datetime.fromisoformat(n["lease_expires_at"]) for n in nodes if n.get("lease_expires_at")
    )


def silent_hosts(attempt: Attempt, now: datetime) -> list[str]:
    """The hosts whose node lease has run out (every host of a one-node attempt whose lease has)."""
    nodes = attempt.placement or []
    expired = [
        str(n.get("host"))
        for n in nodes
        if n.get("lease_expires_at") and datetime.fromisoformat(n["lease_expires_at"]) < now
    ]
    return expired or [str(n.get("host")) for n in nodes]


# ------------------------------------------------------------------------------------- restart limits, backoff


def restart_backoff_s(restart_count: int, timings: Timings) -> float:
    return min(timings.restart_backoff_cap_s, timings.restart_backoff_base_s * 2 ** max(0, restart_count - 1))


def _sla_term(db: Session, job: Job, key: str) -> Any:
    """A term of the job's SLA contract, else of its spec's ``sla`` section (None: neither says)."""
    contract = jobs_repo.effective_sla(db, job.id)
    if contract is not None:
        return getattr(contract, key)
    sla = (job.spec or {}).get("sla") or {}
    return sla.get(key) if isinstance(sla, dict) else None


def max_restarts_for(db: Session, job: Job) -> int:
    term = _sla_term(db, job, "max_restarts")
    return int(term) if term is not None else DEFAULT_MAX_RESTARTS


def recovery_objective_for(db: Session, job: Job) -> float:
    term = _sla_term(db, job, "recovery_time_objective_s")
    return float(term) if term is not None else DEFAULT_RECOVERY_OBJECTIVE_S


# ------------------------------------------------------------------------------------------ after-commit hooks


def after_commit(db: Session, key: str, item: Any, flush: Callable[[list[Any]], None]) -> None:
    """Queue ``item`` for ``flush`` once the session's transaction commits; a rollback forgets it."""
    pending = db.info.setdefault(key, [])
    if not pending:
        event.listen(db, "after_commit", lambda s: flush(s.info.pop(key, [])), once=True)
        event.listen(db, "after_soft_rollback", lambda s, _t: s.info.pop(key, None), once=True)
    pending.append(item)


_REVOKE_KEY = "kiln.revoke_fence"


def _flush_revocations(items: list[Any]) -> None:
    for checkpoint_dir, token in items:
        try:
            if revoke_fence(checkpoint_dir, token):
                log.info("fence of %s revoked for lost token %s", checkpoint_dir, token)
        except OSError:  # storage unreachable from here: the lease file still stops the lost attempt
            log.exception("could not revoke the fence of %s for token %s", checkpoint_dir, token)


def revoke_fence_after_commit(db: Session, attempt: Attempt, storage_dir: Path) -> None:
    """Once the attempt is recorded as ended, take its right to commit away on the shared storage too: a trainer
    nobody supervises (its worker frozen, cut off or dead) stops at its next commit, wherever it runs."""
    item = (job_checkpoint_dir(storage_dir, attempt.job_id), attempt.fencing_token)
    after_commit(db, _REVOKE_KEY, item, _flush_revocations)


# ------------------------------------------------------------------------------------------------ the endings


def end_attempt(
    db: Session, attempt: Attempt, *, state: AttemptState, reason: str, now: datetime, exit_code: int | None = None
) -> None:
    """End an attempt (its GPUs are free from now on), close its usage record, and compare its step time with its
    contract a last time."""
    if attempt.ended_at is None:
        attempt.ended_at = now
        final_step_time_check(db, attempt, now)
    move_attempt(attempt, state)
    attempt.exit_reason = reason[:512]
    if exit_code is not None:
        attempt.exit_code = exit_code
    usage = db.scalars(select(Usage).where(Usage.attempt_id == attempt.id)).first()
    if usage is not None and usage.ended_at is None:
        # A dead worker's last heartbeat is the last moment the GPUs were known to be in use.
        end = attempt.heartbeat_at if state is AttemptState.LOST and attempt.heartbeat_at else now
        end = max(end, usage.started_at)
        usage.ended_at = end
        usage.gpu_seconds = usage.gpus * (end - usage.started_at).total_seconds()


def final_step_time_check(db: Session, attempt: Attempt, now: datetime) -> None:
    """The last comparison of an ending attempt's step time with its contract, its final steps included (a worker
    relays them in the transaction that ends the attempt). The SLA evaluator compares running attempts once a
    cycle; a job that finished between two cycles, or one long enough to compare only in its last seconds, would
    otherwise keep a ``met`` nobody measured. Recorded as the evaluator records it, once per attempt."""
    if jobs_repo.is_best_effort_share(attempt.placement):
        return  # no step time is promised to a best-effort share
    contract = jobs_repo.effective_sla(db, attempt.job_id)
    if contract is None or jobs_repo.has_event_of_attempt(db, attempt.job_id, step_times.VIOLATION, attempt.id):
        return
    w = step_times.windows(db, {attempt.job_id: attempt.id}).get(attempt.job_id)
    found = step_times.violation(w, contract.step_time_tolerance, attempt.id) if w is not None else None
    if found is not None:
        message, data = found
        record_event(db, step_times.VIOLATION, job=attempt.job, message=message, data=data, now=now)


def requeue_after_failure(
    db: Session,
    *,
    job: Job,
    attempt: Attempt,
    reason: str,
    now: datetime,
    settings: Settings,
    data: dict[str, Any] | None = None,
) -> str:
    """An infrastructure failure: LOST (an incident), then QUEUED with backoff or FAILED past max_restarts.

    The lost attempt's trainer may still be alive (a frozen worker, a worker that died while its trainer saved a
    last checkpoint): once this is committed, its fence under the storage directory is revoked. The backoff is
    the settings' (``restart_backoff_*``)."""
    host_names = [n.get("host") for n in attempt.placement or []]
    revoke_fence_after_commit(db, attempt, settings.resolved_storage_dir)
    transition(
        db,
        job,
        JobState.LOST,
        message=reason,
        data={
            "attempt": attempt.number,
            "attempt_id": attempt.id,
            "hosts": host_names,
            "reason": reason,
            "last_step": job.last_step,
            **(data or {}),
        },
        now=now,
    )
    end_attempt(db, attempt, state=AttemptState.LOST, reason=reason, now=now)
    limit = max_restarts_for(db, job)
    if job.restart_count >= limit:
        job.exit_reason = f"{reason}; gave up after {job.restart_count} restarts (max_restarts={limit})"[:512]
        transition(
            db, job, JobState.FAILED, message=job.exit_reason, data={"restart_count": job.restart_count}, now=now
        )
        return f"job {job.id}: FAILED ({job.exit_reason})"
    job.restart_count += 1
    # The backoff escalates only while attempts die without training (a crash loop, a poisoned host);
    # a job that trained and then lost its host starts again at the first level: it did nothing wrong.
    progressed = attempt.first_step_at is not None and job.last_step > (attempt.resumed_from_step or 0)
    previous = db.scalars(
        select(Event).where(Event.job_id == job.id, Event.type == JobState.QUEUED.value).order_by(Event.id.desc())
    ).first()
    prev_level = int((previous.data or {}).get("backoff_level") or 0) if previous is not None else 0
    level = 1 if progressed else prev_level + 1
    backoff = restart_backoff_s(level, settings)
    job.not_before = now + timedelta(seconds=backoff)
    if job.held_at is None:  # held while it ran: it comes back held, the hold's reason standing
        job.pending_reason = Reason.BACKOFF.value
        job.pending_message = f"restart {job.restart_count}/{limit} after: {reason}"[:512]
    transition(
        db,
        job,
        JobState.QUEUED,
        message=f"requeued (restart {job.restart_count}/{limit}, backoff {backoff:.0f} s) from step {job.last_step}",
        data={
            "restart_count": job.restart_count,
            "max_restarts": limit,
            "backoff_s": backoff,
            "backoff_level": level,
            "not_before": job.not_before.isoformat(),
            "avoid_hosts": host_names,
        },
        now=now,
    )
    return f"job {job.id}: LOST -> QUEUED (restart {job.restart_count}/{limit}): {reason}"


def stop_cause(job: Job) -> str | None:
    """Why a job the worker was asked to stop stops: the time limit (the scheduler set the reason) or its sweep's
    early stopping (``core.sweeps.stopping`` did), else the user's cancel. None when nobody asked."""
    if not job.cancel_requested:
        return None
    return job.exit_reason or "cancelled by the user"


def end_attempt_as(
    db: Session,
    *,
    job: Job,
    attempt: Attempt,
    exit_class: ExitClass,
    reason: str,
    now: datetime,
    exit_code: int | None,
    data: dict[str, Any],
    settings: Settings,
) -> None:
    """End the job's current attempt as ``exit_class`` says (``EXIT_CLASS_ENDS``) and move the job on.

    The caller holds the job's row lock and has checked that the attempt still owns the job; a SUCCEEDED job's
    ``last_step`` and ``last_loss`` are already its final checkpoint's."""
    end = EXIT_CLASS_ENDS[exit_class]
    if end.requeue is Requeue.RESTART:
        incident = exit_class.value if exit_class is not ExitClass.FENCED else ExitClass.INFRASTRUCTURE.value
        requeue_after_failure(
            db, job=job, attempt=attempt, reason=reason, now=now, settings=settings, data={**data, "incident": incident}
        )
        attempt.exit_code = exit_code
        return
    end_attempt(db, attempt, state=end.attempt, reason=reason, now=now, exit_code=exit_code)
    if end.requeue is Requeue.KEEP_PROGRESS:
        job.preempt_requested = False
        # Progress is kept (last_step, checkpoints); a preemption is not a restart.
        message = f"{exit_class.value} at step {job.last_step}; back in the queue"
        if job.held_at is not None:  # held while it ran: the hold's reason stands (core.transitions)
            message = f"stopped at step {job.last_step}; back in the queue, held until released"
        else:
            job.pending_reason = end.pending_reason.value if end.pending_reason is not None else None
            job.pending_message = reason[:512]
    elif end.job is JobState.SUCCEEDED:
        job.exit_reason = None
        data = {**data, "last_step": job.last_step, "final_loss": job.last_loss}
        message = f"finished at step {job.last_step}"
    elif end.job is JobState.CANCELLED:
        job.exit_reason = stop_cause(job) or "cancelled"
        message = f"{job.exit_reason} at step {job.last_step}"
    else:
        job.exit_reason = reason[:512]
        message = reason
    transition(db, job, end.job, message=message, data=data, now=now)
