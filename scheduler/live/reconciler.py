"""The reconciler: make PostgreSQL's picture match what is really running, once per scheduler cycle.

- an attempt whose lease expired -> the job is LOST (with the reason) -> QUEUED with a restart counted and an
  exponential backoff, or FAILED past the contract's ``max_restarts``; the attempt ends, so its GPUs are free, and
  once that is committed its fence is revoked on the shared storage (``core.fence``), so that its trainer, if
  it is still alive somewhere, can commit nothing more;
- an attempt no worker picked up in time is dispatched again (the broker is not a database: a job survives
  losing every message), or given up as LOST when its host is gone;
- hosts whose heartbeat went stale are DOWN; hosts reporting GPU hardware errors (Xid, uncorrected ECC) are
  EXCLUDED for a while, so restarts avoid them;
- a committed checkpoint of an ended attempt found on disk without its row is adopted, deleted or reported
  (``scheduler.live.orphan_checkpoints``);
- each failover incident's recovery time (LOST detected -> first training step of the next attempt) is
  recorded against the contract's objective (``RECOVERED`` event);
- after a database outage (this process could not connect, or lost its connection), nothing is declared LOST or
  DOWN for one lease: the workers could not renew their leases nor the host agents heartbeat while the database
  was away, so an expired lease proves nothing until they have had a lease's time to renew it
  (``DATABASE_BACK`` event); a scheduler that starts after the outage keeps a recorded grace that has not ended,
  and gives one when the PostgreSQL server itself is younger than a lease.

Attempts end and jobs are requeued through ``core.lifecycle``, as in the workers. ``reconcile`` only reads and
writes through the session it is given; the loop that calls it commits. Messages to the broker (through the
``dispatch`` callable it is handed) and fence revocations happen only after that commit (a session
``after_commit`` hook), never for a rolled-back decision.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, event, select, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.lifecycle import (
    after_commit,
    end_attempt,
    recovery_objective_for,
    requeue_after_failure,
    revoke_fence_after_commit,
    silent_hosts,
)
from core.models import Attempt, Event, Host, Job
from core.settings import Settings
from core.states import ACTIVE, AttemptState, HostState, JobState
from core.transitions import move_host, record_event
from scheduler.live.leader import Term
from scheduler.live.orphan_checkpoints import reconcile_checkpoints

log = logging.getLogger(__name__)


DispatchAttempt = Callable[[int, int, list[dict[str, Any]]], None]  # (attempt id, fencing token, placement)


def pickup_timeout_s(settings: Settings) -> float:
    """How long an admitted attempt may wait for a worker before it is sent again."""
    return max(15.0, 4 * settings.heartbeat_interval_s)


def host_stale_s(settings: Settings) -> float:
    """A host is DOWN after this long without a heartbeat; shorter than the lease, so that a job lost with its
    host is requeued when the host is already known to be gone and is placed elsewhere."""
    return max(3 * settings.heartbeat_interval_s, settings.lease_s / 2)


# --------------------------------------------------------------------------------------------- re-dispatch

_DISPATCH_KEY = "kiln.redispatch"


def dispatch_after_commit(db: Session, attempt: Attempt, dispatch: DispatchAttempt) -> None:
    def flush(items: list[Any]) -> None:
        for attempt_id, token, placement in items:
            try:
                dispatch(attempt_id, token, placement)
            except Exception:  # the broker is away: the next pickup timeout tries again
                log.exception("re-dispatch of attempt %s failed", attempt_id)

    after_commit(db, _DISPATCH_KEY, (attempt.id, attempt.fencing_token, list(attempt.placement or [])), flush)


# ------------------------------------------------------------------------------------- database outage grace


@dataclass
class _Outage:
    """What one engine (one database) has seen: a failed connect or a dropped connection since the last pass."""

    seen: bool = False
    grace_until: datetime | None = None
    looked_back: bool = False  # this process's first pass looked for an outage it cannot have seen


_OUTAGES: weakref.WeakKeyDictionary[Engine, _Outage] = weakref.WeakKeyDictionary()
_OUTAGES_LOCK = threading.Lock()


def _on_db_error(engine: Engine, ctx: ExceptionContext) -> None:
    # No connection at all (the server refused or is unreachable), or a connection that died under us: the
    # database was away. Statement errors (constraint, lock, serialization failures) are not outages.
    if ctx.connection is None or ctx.is_disconnect:
        with _OUTAGES_LOCK:
            _OUTAGES.setdefault(engine, _Outage()).seen = True


def _outage_state(db: Session) -> _Outage:
    """The outage record of the session's engine; watches the engine's errors from the first pass on."""
    bind = db.get_bind()
    engine: Engine = bind if isinstance(bind, Engine) else bind.engine
    with _OUTAGES_LOCK:
        state = _OUTAGES.get(engine)
        if state is None:
            state = _OUTAGES[engine] = _Outage()
            ref = weakref.ref(engine)

            def listener(ctx: ExceptionContext) -> None:
                e = ref()
                if e is not None:
                    _on_db_error(e, ctx)

            event.listen(engine, "handle_error", listener)
        return state


def _grace(db: Session, now: datetime, settings: Settings, term: Term | None) -> tuple[datetime | None, list[str]]:
    """``grace_until`` while the database is freshly back (None otherwise), and the action that started it.

    The grace is one lease from the first pass after the outage: a live worker retries its heartbeat every
    ``heartbeat_interval_s`` and renews its lease well within it; a worker that died during the outage does not,
    and is declared LOST when the grace ends. This process sees an outage through its engine's errors; on its
    first pass it also looks for one it cannot have seen (it started, or became the leader, after it):
    ``_outage_before_this_process``. Whichever scheduler leads, the leader's lease says since when some scheduler
    watched without a gap (``Term.watched_since``): the grace also counts from there.
    """
    state = _outage_state(db)
    actions: list[str] = []
    if not state.looked_back:
        state.looked_back = True
        earlier, why = _outage_before_this_process(db, now, settings)
        if earlier is not None and (state.grace_until is None or earlier > state.grace_until):
            state.grace_until = earlier
            if why is not None:
                record_event(
                    db,
                    EventType.DATABASE_BACK,
                    message=f"{why}: leases and host heartbeats get grace until "
                    f"{earlier.isoformat(timespec='seconds')}",
                    data={"grace_until": earlier.isoformat(), "grace_s": settings.lease_s, "cause": why},
                )
            actions.append(
                f"database back before this scheduler: grace for leases and hosts until "
                f"{earlier.isoformat(timespec='seconds')}"
            )
    if term is not None:
        actions += _unwatched_grace(db, now, settings, term, state)
    with _OUTAGES_LOCK:
        seen, state.seen = state.seen, False
    if seen and (term is None or term.unwatched_s is None):  # a gap the lease saw is said once, above
        state.grace_until = now + timedelta(seconds=settings.lease_s)
        record_event(
            db,
            EventType.DATABASE_BACK,
            message=f"database reachable again: leases and host heartbeats get {settings.lease_s:.0f} s of grace"
            " before anything is declared LOST or DOWN",
            data={"grace_until": state.grace_until.isoformat(), "grace_s": settings.lease_s},
        )
        actions.append(f"database back: {settings.lease_s:.0f} s of grace for leases and hosts")
    if state.grace_until is not None and now >= state.grace_until:
        state.grace_until = None
    return state.grace_until, actions


def _unwatched_grace(db: Session, now: datetime, settings: Settings, term: Term, state: _Outage) -> list[str]:
    """Grace for silence that fell where no scheduler held the lease (the database was away, or every scheduler
    was): it counts from the first renewal after the gap, whichever scheduler made it, not from this one's start."""
    until = term.watched_since + timedelta(seconds=settings.lease_s)
    if until > now and (state.grace_until is None or until > state.grace_until):
        state.grace_until = until
    if term.unwatched_s is None:
        return []
    record_event(
        db,
        EventType.DATABASE_BACK,
        message=f"no scheduler held the lease for {term.unwatched_s:.1f} s (the database or every scheduler was "
        f"away): leases and host heartbeats get grace until {until.isoformat(timespec='seconds')}",
        data={
            "grace_until": until.isoformat(),
            "grace_s": settings.lease_s,
            "unwatched_s": term.unwatched_s,
            "cause": "lease gap",
        },
    )
    return [
        f"no scheduler for {term.unwatched_s:.1f} s: grace for leases and hosts until "
        f"{until.isoformat(timespec='seconds')}"
    ]


def _outage_before_this_process(db: Session, now: datetime, settings: Settings) -> tuple[datetime | None, str | None]:
    """A grace still running that this process did not start, and why (None: already recorded).

    Either a ``DATABASE_BACK`` that another scheduler (or this one before a restart) recorded and whose grace has
    not ended, or a PostgreSQL server that started less than a lease ago: every lease and heartbeat written before
    the restart may have expired while it was down, whoever was watching.
    """
    until: datetime | None = None
    why: str | None = None
    last = db.scalars(
        select(Event).where(Event.type == EventType.DATABASE_BACK).order_by(Event.id.desc()).limit(1)
    ).first()
    if last is not None:
        try:
            recorded = datetime.fromisoformat(str((last.data or {}).get("grace_until")))
        except ValueError:
            recorded = None
        if recorded is not None and recorded.tzinfo is not None and recorded > now:
            until = recorded
    if db.get_bind().dialect.name == "postgresql":
        started: datetime = db.execute(text("SELECT pg_postmaster_start_time()")).scalar_one()
        server_until = started + timedelta(seconds=settings.lease_s)
        if server_until > now and (until is None or server_until > until):
            until, why = server_until, f"PostgreSQL started at {started.isoformat(timespec='seconds')}"
    return until, why


def reset_outage_tracking() -> None:
    """Forget every engine's outage record (tests)."""
    with _OUTAGES_LOCK:
        for state in _OUTAGES.values():
            state.seen = False
            state.grace_until = None
            state.looked_back = False


# ------------------------------------------------------------------------------------------------- reconcile


def reconcile(
    *, db: Session, now: datetime, settings: Settings, dispatch: DispatchAttempt, term: Term | None = None
) -> list[str]:
    """One pass; returns what it did, one line per action. Does not commit; ``dispatch`` sends an attempt that
    no worker picked up once more, after the caller's commit. ``term``: the leader's renewal of this cycle."""
    grace_until, actions = _grace(db, now, settings, term)
    actions += _hosts(db, now, settings, grace_until)
    actions += _expired_leases(db, now, settings, grace_until)
    actions += _unclaimed_attempts(db, now, settings, dispatch, grace_until)
    actions += reconcile_checkpoints(db, now, settings)  # disk and rows agree for the attempts that ended
    actions += _recoveries(db)
    return actions


def _hosts(db: Session, now: datetime, settings: Settings, grace_until: datetime | None = None) -> list[str]:
    actions: list[str] = []
    stale_before = now - timedelta(seconds=host_stale_s(settings))
    # The host agents could not heartbeat while the database was away either: none goes DOWN during the grace.
    in_grace = grace_until is not None and now < grace_until
    for host in db.scalars(select(Host).order_by(Host.id).with_for_update()).all():
        bad = [g for g in host.gpus if not g.healthy]
        stale = host.last_heartbeat_at is None or host.last_heartbeat_at < stale_before
        if host.state != HostState.DOWN and stale and not in_grace:
            silent = (now - host.last_heartbeat_at).total_seconds() if host.last_heartbeat_at else None
            move_host(host, HostState.DOWN)
            record_event(
                db,
                EventType.HOST_DOWN,
                message=f"host {host.name}: no heartbeat for {silent or 0:.1f} s",
                data={"host": host.name, "silent_s": silent},
            )
            actions.append(f"host {host.name}: DOWN")
        elif bad and host.state in (HostState.UP, HostState.UNREACHABLE):
            reasons = []
            for g in bad:
                errors = (g.last_sample or {}).get("errors") or ["unhealthy"]
                reasons.append(f"GPU {g.index} ({g.uuid}): {', '.join(str(e) for e in errors)}")
            move_host(host, HostState.EXCLUDED)
            host.excluded_until = now + timedelta(seconds=settings.gpu_exclusion_s)
            host.exclusion_reason = "; ".join(reasons)[:256]
            record_event(
                db,
                EventType.HOST_EXCLUDED,
                message=f"host {host.name} excluded: {host.exclusion_reason}",
                data={"host": host.name, "until": host.excluded_until.isoformat(), "gpus": [g.uuid for g in bad]},
            )
            actions.append(f"host {host.name}: EXCLUDED ({host.exclusion_reason})")
        elif host.state == HostState.EXCLUDED and host.excluded_until is not None and host.excluded_until <= now:
            # Served its time: trusted again; a GPU that errs again is excluded again by the agent's report.
            for g in host.gpus:
                g.healthy = True
            move_host(host, HostState.UP)
            host.excluded_until = None
            host.exclusion_reason = None
            record_event(
                db, EventType.HOST_READMITTED, message=f"host {host.name} readmitted", data={"host": host.name}
            )
            actions.append(f"host {host.name}: readmitted")
    return actions


def _locked_job(db: Session, job_id: int) -> Job | None:
    return db.get(Job, job_id, with_for_update=True, populate_existing=True)


def _expired_leases(db: Session, now: datetime, settings: Settings, grace_until: datetime | None = None) -> list[str]:
    actions: list[str] = []
    if grace_until is not None and now < grace_until:
        return actions  # the database was away: the workers get one lease to renew before anything is LOST
    expired = db.scalars(
        select(Attempt.id)
        .where(Attempt.state == AttemptState.RUNNING, Attempt.lease_expires_at < now)
        .order_by(Attempt.id)
    ).all()
    for attempt_id in expired:
        attempt = db.get(Attempt, attempt_id)
        assert attempt is not None
        job = _locked_job(db, attempt.job_id)
        db.refresh(attempt, with_for_update=True)
        if job is None or attempt.state != AttemptState.RUNNING or attempt.lease_expires_at is None:
            continue
        if attempt.lease_expires_at >= now:  # renewed while we waited for the lock
            continue
        if job.fencing_token != attempt.fencing_token or job.state not in ACTIVE:
            revoke_fence_after_commit(db, attempt, settings.resolved_storage_dir)  # it may still be alive
            why = "lease expired after the job moved on"
            end_attempt(db, attempt, state=AttemptState.SUPERSEDED, reason=why, now=now)
            actions.append(f"attempt {attempt.id}: superseded")
            continue
        # A gang's lease is its earliest node's: name the hosts that went silent, timed from their own lease.
        silent = (now - attempt.lease_expires_at).total_seconds() + settings.lease_s
        hosts = ", ".join(silent_hosts(attempt, now))
        reason = f"lease expired: no heartbeat from {hosts} for {silent:.1f} s"
        actions.append(
            requeue_after_failure(
                db,
                job=job,
                attempt=attempt,
                reason=reason,
                now=now,
                settings=settings,
                data={
                    "silent_s": silent,
                    "lease_expired_at": attempt.lease_expires_at.isoformat(),
                    "incident": "lease_expired",
                },
            )
        )
    return actions


def _unclaimed_attempts(
    db: Session, now: datetime, settings: Settings, dispatch: DispatchAttempt, grace_until: datetime | None = None
) -> list[str]:
    actions: list[str] = []
    timeout = timedelta(seconds=pickup_timeout_s(settings))
    pending = db.scalars(select(Attempt).where(Attempt.state == AttemptState.PENDING).order_by(Attempt.id)).all()
    for attempt in pending:
        deadline = attempt.lease_expires_at or (attempt.created_at + timeout)
        if grace_until is not None:  # a worker may have claimed it and failed to write so while the DB was away
            deadline = max(deadline, grace_until)
        if deadline >= now:
            continue
        job = _locked_job(db, attempt.job_id)
        db.refresh(attempt, with_for_update=True)
        if job is None or attempt.state != AttemptState.PENDING:
            continue
        if job.fencing_token != attempt.fencing_token or job.state not in ACTIVE:
            end_attempt(db, attempt, state=AttemptState.SUPERSEDED, reason="never started; the job moved on", now=now)
            actions.append(f"attempt {attempt.id}: superseded before it started")
            continue
        names = [str(n.get("host")) for n in attempt.placement or []]
        hosts = db.scalars(select(Host).where(Host.name.in_(names))).all()
        gone = sorted(set(names) - {h.name for h in hosts if h.state == HostState.UP})
        sent = [
            e
            for e in db.scalars(select(Event).where(Event.job_id == job.id, Event.type == EventType.REDISPATCHED)).all()
            if (e.data or {}).get("attempt_id") == attempt.id
        ]
        if gone or len(sent) >= settings.max_redispatches:
            why = f"hosts not available: {', '.join(gone)}" if gone else f"not picked up after {len(sent)} re-sends"
            actions.append(
                requeue_after_failure(
                    db,
                    job=job,
                    attempt=attempt,
                    reason=f"attempt {attempt.number} never started: {why}",
                    now=now,
                    settings=settings,
                    data={"incident": "never_started"},
                )
            )
            continue
        attempt.lease_expires_at = now + timeout
        record_event(
            db,
            EventType.REDISPATCHED,
            job=job,
            message=f"attempt {attempt.number} not picked up in {timeout.total_seconds():.0f} s; sent again",
            data={"attempt_id": attempt.id, "attempt": attempt.number, "hosts": names},
        )
        dispatch_after_commit(db, attempt, dispatch)
        actions.append(f"attempt {attempt.id}: re-dispatched")
    return actions


def _recoveries(db: Session) -> list[str]:
    """RECOVERED for each LOST incident whose job has trained again since (first step of a later attempt)."""
    actions: list[str] = []
    current = (Attempt.job_id == Job.id) & (Attempt.fencing_token == Job.fencing_token)
    trained_again = (Job.restart_count > 0, Attempt.first_step_at.is_not(None), Attempt.number > 1)
    rows = db.execute(select(Job, Attempt).join(Attempt, current).where(*trained_again)).all()
    if not rows:
        return actions
    # The incidents of all those jobs in one query (not one per job: this runs every cycle, over every job that
    # ever restarted), selected by the same condition in SQL rather than a list of ids.
    events_of: dict[int | None, list[Event]] = {}
    for job_id, e in db.execute(
        select(Event.job_id, Event)
        .where(
            Event.job_id.in_(select(Job.id).join(Attempt, current).where(*trained_again)),
            Event.type.in_((JobState.LOST.value, EventType.RECOVERED)),
        )
        .order_by(Event.id)
    ).tuples():
        events_of.setdefault(job_id, []).append(e)
    for job, attempt in rows:
        events = events_of.get(job.id, [])
        recovered_ids = {(e.data or {}).get("lost_event_id") for e in events if e.type == EventType.RECOVERED}
        assert attempt.first_step_at is not None
        lost = [e for e in events if e.type == JobState.LOST and e.created_at <= attempt.first_step_at]
        if not lost or lost[-1].id in recovered_ids:
            continue
        incident = lost[-1]
        recovery = (attempt.first_step_at - incident.created_at).total_seconds()
        objective = recovery_objective_for(db, job)
        silent = (incident.data or {}).get("silent_s")
        record_event(
            db,
            EventType.RECOVERED,
            job=job,
            message=f"recovered in {recovery:.1f} s (objective {objective:.0f} s)"
            f" on attempt {attempt.number}, resumed from step {attempt.resumed_from_step}",
            data={
                "lost_event_id": incident.id,
                "attempt": attempt.number,
                "recovery_time_s": recovery,
                "objective_s": objective,
                "met": recovery <= objective,
                "detection_s": silent,
                "resumed_from_step": attempt.resumed_from_step,
                "lost_at_step": (incident.data or {}).get("last_step"),
                "hosts": [n.get("host") for n in attempt.placement or []],
            },
        )
        actions.append(f"job {job.id}: recovered in {recovery:.1f} s")
    return actions
