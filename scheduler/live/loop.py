"""The live loop: reconcile -> snapshot -> plan -> apply -> adaptive sweeps' proposals -> commit -> dispatch, on
NOTIFY and on a timer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from core import compile_cache
from core.db import idle_timeout_s, make_engine, utcnow
from core.deployment import StorageOfAnotherDeployment, check_storage
from core.liveness import Pulse
from core.policy_config import PolicyConfig
from core.retention import RetentionReport, prune_database
from core.services import artifacts
from core.services.fit import FitSettings
from core.settings import Settings, get_settings
from core.sweeps.search import propose_due
from scheduler.live import sla
from scheduler.live.apply import Dispatch, apply_all
from scheduler.live.forecast_record import Recorded, record_pass
from scheduler.live.leader import LOCK_KEY, Leadership, LeadershipLost, leadership_for
from scheduler.live.loader import load_snapshot
from scheduler.live.metrics import SchedulerMetrics
from scheduler.live.reconciler import DispatchAttempt, reconcile
from scheduler.policy.plan import plan

log = logging.getLogger(__name__)

CYCLE_LOCK_KEY = LOCK_KEY + 1  # serialises cycles inside PostgreSQL even if two loops ever overlap


@dataclass
class CycleResult:
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    pending: int = 0
    reasons_written: int = 0
    reconciled: list[str] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)  # jobs adaptive sweeps submitted
    violations: list[str] = field(default_factory=list)
    dispatched: int = 0
    dispatch_errors: int = 0
    dispatch_s: list[float] = field(default_factory=list)  # each message's send time
    forecasts: Recorded = Recorded(0, 0)  # first start forecasts made, forecasts settled (after the commit)
    plan_s: float = 0.0
    total_s: float = 0.0
    # The earliest time (POSIX seconds) a queued job's backoff or begin time ends: a cycle is due then, not only
    # at the next interval (a requeued job restarts when its backoff ends, not up to an interval later).
    next_due: float | None = None


def _dispatch(dispatches: list[Dispatch], dispatch: DispatchAttempt, times: list[float]) -> tuple[int, int]:
    """Send each attempt's task message; appends each send's duration to ``times``."""
    ok = errors = 0
    for attempt_id, token, placement in dispatches:
        t0 = time.perf_counter()
        try:
            dispatch(attempt_id, token, placement)
            ok += 1
        except Exception:  # the broker is away: the reconciler re-dispatches attempts nobody picked up
            log.exception("dispatch of attempt %s failed", attempt_id)
            errors += 1
        times.append(time.perf_counter() - t0)
    return ok, errors


def run_cycle(
    *,
    session_factory: Callable[[], Session],
    dispatch: DispatchAttempt,
    now: datetime | None = None,
    config: PolicyConfig | None = None,
    settings: Settings | None = None,
    leadership: Leadership | None = None,
) -> CycleResult:
    """One scheduling cycle in one transaction; ``dispatch`` sends each new attempt to its hosts after the commit
    (the process entry point passes the broker's: ``workers.dispatch.dispatch_attempt``). The policy is ``config``,
    else the settings' (``KILN_POLICY__*``). With ``leadership``, the cycle first renews its term inside the
    transaction (``LeadershipLost``: nothing is written)."""
    started = time.perf_counter()
    now = now or utcnow()
    settings = settings or get_settings()
    result = CycleResult()
    db = session_factory()
    try:
        if db.get_bind().dialect.name == "postgresql":
            db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CYCLE_LOCK_KEY})
        term = leadership.hold(db) if leadership is not None else None
        result.reconciled = reconcile(db=db, now=now, settings=settings, dispatch=dispatch, term=term)
        db.flush()
        policy = config or settings.policy
        snapshot = load_snapshot(db=db, now=now, half_life_s=policy.fairshare_half_life_s)
        t0 = time.perf_counter()
        decisions = plan(snapshot, policy)
        result.plan_s = time.perf_counter() - t0
        applied = apply_all(db=db, decisions=decisions, now=now)
        violations = sla.evaluate(db=db, now=now)
        enforced = apply_all(db=db, decisions=sla.enforcement(violations), now=now)
        result.violations = [f"{v.type} job {v.job_id}" for v in violations]
        # Last, once no job row is to be locked any more: adaptive sweeps' next jobs, planned by the cycle their
        # NOTIFY starts.
        result.proposed = propose_due(
            db=db, max_unfinished=settings.max_unfinished_jobs_per_team, fit=FitSettings.of(settings)
        )
        db.commit()
    except BaseException:
        db.rollback()
        raise
    finally:
        db.close()
    result.admitted, result.preempted = applied.admitted, applied.preempted + enforced.preempted
    result.failed, result.killed = applied.failed, applied.killed
    result.pending = len(decisions.pending)
    result.next_due = min(
        (p.not_before for p in snapshot.pending if p.not_before and p.not_before > now.timestamp()), default=None
    )
    result.reasons_written = applied.reasons_written
    result.dispatched, result.dispatch_errors = _dispatch(applied.dispatches, dispatch, result.dispatch_s)
    result.forecasts = record_pass(
        session_factory=session_factory, snapshot=snapshot, policy=policy, now=now, leadership=leadership
    )
    result.total_s = time.perf_counter() - started
    return result


def retain(
    *, session_factory: Callable[[], Session], settings: Settings, now: datetime, leadership: Leadership | None = None
) -> RetentionReport:
    """One retention pass (core/retention.py) in a transaction of its own, outside the scheduling cycle."""
    db = session_factory()
    try:
        if leadership is not None:
            leadership.hold(db)
        report = prune_database(db, settings, now)
        db.commit()
        return report
    except BaseException:
        db.rollback()
        raise
    finally:
        db.close()


def observe(metrics: SchedulerMetrics, result: CycleResult) -> None:
    metrics.cycle_seconds.observe(result.total_s)
    metrics.plan_seconds.observe(result.plan_s)
    for kind, n in (
        ("admitted", len(result.admitted)),
        ("preempted", len(result.preempted)),
        ("failed", len(result.failed)),
        ("killed", len(result.killed)),
        ("reconciled", len(result.reconciled)),
        ("proposed", len(result.proposed)),
    ):
        if n:
            metrics.decisions.labels(kind).inc(n)
    metrics.pending.set(result.pending)
    for seconds in result.dispatch_s:
        metrics.dispatch_seconds.observe(seconds)
    if result.dispatch_errors:
        metrics.dispatch_errors.inc(result.dispatch_errors)


def _retain_logged(
    factory: Callable[[], Session], settings: Settings, metrics: SchedulerMetrics, leadership: Leadership
) -> None:
    try:
        report = retain(session_factory=factory, settings=settings, now=utcnow(), leadership=leadership)
    except LeadershipLost:
        raise
    except Exception:
        log.exception("retention pass failed; retrying after the next interval")
        return
    for what, n in vars(report).items():
        if n:
            metrics.retention_deleted.labels(what).inc(n)
    if report:
        log.info("retention: %s", report)


ARTIFACT_GC_INTERVAL_S = 600.0  # how often the leader collects unused code archives (their age is a setting)


def collect_artifacts(
    session_factory: Callable[[], Session], settings: Settings, leadership: Leadership | None = None
) -> int:
    """Delete the archives no active job names whose last use is older than ``artifact_retention_s``: the rows in
    one transaction, the files after it committed."""
    with session_factory() as db:
        if leadership is not None:
            leadership.hold(db)
        files = artifacts.collect(db, storage=settings.resolved_storage_dir, retention_s=settings.artifact_retention_s)
        db.commit()
    artifacts.remove_files(files)
    if files:
        log.info("collected %d unused code archives", len(files))
    return len(files)


def collect_compile_caches(settings: Settings) -> int:
    """Delete team compile-cache entries unused for ``compile_cache_retention_days``, then each team's least
    recently used ones over ``compile_cache_team_quota_bytes``. Files only: no row names an entry."""
    done = compile_cache.collect(
        settings.resolved_storage_dir,
        max_age_s=settings.compile_cache_retention_days * 86400.0,
        quota_bytes=settings.compile_cache_team_quota_bytes,
    )
    if done.entries:
        log.info("collected %d compile-cache entries (%d bytes)", done.entries, done.bytes)
    return done.entries


def _storage_is_ours(factory: Callable[[], Session], settings: Settings) -> bool:
    """A new leader revokes fences and collects code archives in the storage directory: it must be this
    database's. False (logged) when the check could not be made; another deployment's storage raises."""
    try:
        with factory() as db:
            check_storage(db, settings.resolved_storage_dir)
    except StorageOfAnotherDeployment:
        raise
    except Exception:
        log.exception("could not check who owns the storage directory; retrying")
        return False
    return True


def _collect_logged(factory: Callable[[], Session], settings: Settings, leadership: Leadership) -> None:
    """The leader's periodic collections (unused code archives, stale compile-cache entries); a failure waits for
    the next period."""
    try:
        collect_artifacts(factory, settings, leadership)
    except LeadershipLost:
        raise
    except Exception:
        log.exception("collecting unused code archives failed; retrying later")
    try:
        collect_compile_caches(settings)
    except Exception:
        log.exception("collecting compile-cache entries failed; retrying later")


def _cycle_logged(
    factory: Callable[[], Session],
    settings: Settings,
    *,
    dispatch: DispatchAttempt,
    leadership: Leadership,
    metrics: SchedulerMetrics,
    pulse: Pulse,
) -> float | None:
    """One cycle, observed and logged; a failed cycle is counted and the next tick tries again. Returns when the
    next cycle is due before the interval, if it is (``CycleResult.next_due``)."""
    try:
        result = run_cycle(session_factory=factory, dispatch=dispatch, settings=settings, leadership=leadership)
        pulse.beat("leading")  # only a committed cycle: a leader failing every cycle goes stale
        observe(metrics, result)
        if result.admitted or result.preempted or result.failed or result.reconciled or result.proposed:
            log.info(
                "cycle: admitted %s preempted %s failed %s reconciled %d proposed %s (plan %.1f ms)",
                result.admitted,
                result.preempted,
                result.failed,
                len(result.reconciled),
                result.proposed,
                result.plan_s * 1000,
            )
        return result.next_due
    except LeadershipLost:
        raise
    except Exception:
        metrics.cycle_failures.inc()
        log.exception("scheduling cycle failed; retrying on the next tick")
        return None


def _until(next_due: float | None, interval: float) -> float:
    """How long the leader waits for the next cycle: the interval, or less when a queued job is due before it (a
    small margin after, so the cycle's clock has passed the due time)."""
    if next_due is None:
        return interval
    return max(0.0, min(interval, next_due - time.time() + 0.05))


def run_forever(
    settings: Settings,
    *,
    dispatch: DispatchAttempt,
    stop: threading.Event | None = None,
    metrics: SchedulerMetrics | None = None,
) -> None:
    """Campaign for leadership; while leading, run a cycle on every NOTIFY and at least every interval, with the
    settings' policy."""
    stop = stop or threading.Event()
    metrics = metrics or SchedulerMetrics()
    url = settings.resolved_database_url
    # A leader frozen inside a cycle's transaction holds the lease row: the server ends that session within half a
    # leader's lease (or the deployment's shorter timeout), so a standby can take over.
    idle_s = min(idle_timeout_s(settings), settings.leader_lease_s / 2)
    engine = make_engine(url, idle_in_transaction_s=idle_s)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    leadership = leadership_for(url, settings.home, lease_s=settings.leader_lease_s)
    interval = settings.scheduler_interval_s
    pulse = Pulse(settings.liveness_file, interval)  # the container healthcheck reads it
    next_retention = 0.0  # monotonic; the leader prunes at its start, then every retention_interval_s
    try:
        while not stop.is_set():
            if not leadership.try_acquire():
                pulse.beat("standby")
                stop.wait(min(interval, settings.standby_retry_s))  # a standby takes over within seconds
                continue
            log.info("scheduler: leading")
            metrics.leader.set(1)
            if not _storage_is_ours(factory, settings):
                leadership.release()
                metrics.leader.set(0)
                stop.wait(min(interval, settings.standby_retry_s))
                continue
            next_gc = time.monotonic()
            try:
                while not stop.is_set():
                    if time.monotonic() >= next_gc:
                        next_gc = time.monotonic() + ARTIFACT_GC_INTERVAL_S
                        _collect_logged(factory, settings, leadership)
                    next_due = _cycle_logged(
                        factory, settings, dispatch=dispatch, leadership=leadership, metrics=metrics, pulse=pulse
                    )
                    if time.monotonic() >= next_retention:
                        next_retention = time.monotonic() + settings.retention_interval_s
                        _retain_logged(factory, settings, metrics, leadership)
                    leadership.wait(_until(next_due, interval), stop)
            except LeadershipLost as e:
                log.warning("scheduler: stepping down: %s", e)
            except Exception:
                log.exception("scheduler: lost leadership")
            finally:
                metrics.leader.set(0)
                leadership.release()
    finally:
        leadership.release()
        engine.dispose()
