"""The host agent: registers the host and its GPUs, heartbeats, and samples GPU health, in a thread of the worker.

The heartbeat is what the reconciler reads to declare a host DOWN; GPU errors it records (``gpus.healthy``,
``gpus.last_sample.errors``) are what make the reconciler exclude the host. A heartbeat says the process lives, not
that it takes work: the host is UP only while its Celery consumer consumes (``workers.consumer_probe``), else
UNREACHABLE, and the scheduler places nothing on it.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from core.db import session_scope, utcnow
from core.deployment import deployment_uid, local_tier_jobs
from core.event_types import EventType
from core.gpu_types import canonical
from core.lifecycle import requeue_after_failure
from core.liveness import Pulse
from core.models import GPU, Attempt, Host, Job
from core.retention import prune_job_files, prune_local_tier
from core.settings import Settings
from core.states import ACTIVE, AttemptState, HostState
from core.transitions import move_host, record_event
from workers import mps
from workers.celery_app import host_queue
from workers.consumer_probe import ConsumerProbe
from workers.inventory import GpuInfo, Inventory
from workers.metrics import WorkerMetrics

log = logging.getLogger(__name__)


class HostAgent:
    def __init__(
        self,
        *,
        name: str,
        inventory: Inventory,
        cpu_slots: int,
        address: str | None,
        settings: Settings,
        incarnation: str | None = None,
        pulse: Pulse | None = None,
        consumer: ConsumerProbe | None = None,
        metrics: WorkerMetrics | None = None,
    ):
        self.name = name
        self.inventory = inventory
        self.cpu_slots = cpu_slots
        self.address = address
        self.settings = settings
        self.heartbeat_interval_s = settings.heartbeat_interval_s
        self.sample_interval_s = settings.gpu_sample_interval_s
        self.pulse = pulse or Pulse(None, self.heartbeat_interval_s)  # beats after each committed heartbeat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.slots = 0
        self.discovered: list[GpuInfo] = []  # what NVML said at the last registration (device minors included)
        self.incarnation = incarnation  # this worker process (worker_state.WORKER_INCARNATION)
        self.consumer = consumer  # None: nothing to probe (a test's agent without a Celery worker)
        self.metrics = metrics or WorkerMetrics()

    def record_isolation(self, db: Session, mode: str, note: str) -> None:
        """Whether this host sandboxes attempts (``workers.isolation``): the scheduler places a team's own code only
        where it does (or where the operator turned the sandbox off), and ``kiln hosts`` shows it."""
        host = db.scalars(select(Host).where(Host.name == self.name).with_for_update()).first()
        if host is not None:
            host.isolation, host.isolation_note = mode, note[:512]

    def register(self, db: Session) -> Host:
        """Create or update the host row and its GPUs (GPUs that disappeared are removed)."""
        now = utcnow()
        gpus = self.discovered = self.inventory.discover()
        host = db.scalars(select(Host).where(Host.name == self.name).with_for_update()).first()
        if host is None:
            host = Host(
                name=self.name, queue=host_queue(self.name), links={}, registered_at=now, state=HostState.UP.value
            )
            db.add(host)
        host.queue = host_queue(self.name)
        host.address = self.address
        host.cpu_slots = 0 if gpus else self.cpu_slots
        if not (host.excluded_until and host.excluded_until > now):
            move_host(host, HostState.UP)
        host.last_heartbeat_at = now
        db.flush()
        existing = {g.uuid: g for g in host.gpus}
        seen = set()
        for info in gpus:
            seen.add(info.uuid)
            row = existing.get(info.uuid) or db.scalars(select(GPU).where(GPU.uuid == info.uuid)).first()
            gpu_type = canonical(info.model)  # NVML's "NVIDIA H200" is the type "H200" everywhere in kiln
            if row is None:
                row = GPU(uuid=info.uuid, index=info.index, model=gpu_type, memory_bytes=info.memory_bytes)
            if row not in host.gpus:  # new, or moved here from another host entry (same physical GPU)
                host.gpus.append(row)
            row.index = info.index
            row.model = gpu_type
            row.name = info.model
            row.memory_bytes = info.memory_bytes
            row.mig_mode = info.mig_mode
            row.pcie_gen = info.pcie_gen
            row.nvlink_peers = list(info.nvlink_peers)
        for uuid, row in existing.items():
            if uuid not in seen:
                db.delete(row)
        self.slots = len(gpus) or self.cpu_slots
        types = sorted({canonical(g.model) for g in gpus})
        self.end_orphans(db)
        record_event(
            db,
            EventType.HOST_REGISTERED,
            message=f"host {self.name}: {len(gpus)} GPUs{' (' + ', '.join(types) + ')' if types else ''}, "
            f"{host.cpu_slots} CPU slots",
            data={"host": self.name, "gpus": [g.uuid for g in gpus], "gpu_types": types, "cpu_slots": host.cpu_slots},
        )
        return host

    def end_orphans(self, db: Session) -> list[str]:
        """Attempts a previous worker process on this host was supervising: that process is gone (a crash, a
        SIGKILL, a restart), and with it their supervision, so they are lost now -- at the new worker's start --
        instead of when their lease runs out (30 s on the H200 host, most of a restart's time). Their trainers
        were told to stop when the worker died (parent-death signal); the one checkpoint each may still be saving on
        its way out is not committed once this is: their fence is revoked (``requeue_after_failure``)."""
        now = utcnow()
        actions = []
        running = select(Attempt).where(Attempt.state == AttemptState.RUNNING).order_by(Attempt.id)
        for attempt in db.scalars(running).all():
            mine = [n for n in attempt.placement or [] if n.get("host") == self.name and n.get("claimed_by")]
            if not mine or all(n.get("worker") == self.incarnation for n in mine):
                continue
            job = db.get(Job, attempt.job_id, with_for_update=True, populate_existing=True)  # the job row first
            db.refresh(attempt, with_for_update=True)
            if job is None or attempt.state != AttemptState.RUNNING or job.fencing_token != attempt.fencing_token:
                continue
            if job.state not in ACTIVE:
                continue
            silent = (now - attempt.heartbeat_at).total_seconds() if attempt.heartbeat_at else None
            reason = f"the worker on {self.name} restarted; attempt {attempt.number} lost its supervisor"
            data = {"incident": "worker_restarted", "silent_s": silent}
            actions.append(
                requeue_after_failure(
                    db, job=job, attempt=attempt, reason=reason, now=now, data=data, settings=self.settings
                )
            )
        return actions

    def heartbeat(self, db: Session) -> None:
        host = db.scalars(select(Host).where(Host.name == self.name).with_for_update()).first()
        if host is None:  # deleted by an admin while we ran: register again
            self.register(db)
            return
        now = utcnow()
        host.last_heartbeat_at = now
        self.watch_mps(db, host)
        consuming = self.consumer is None or self.consumer.consuming()
        if host.state == HostState.DOWN:
            # An exclusion outlives a restart of the host: bad GPUs are still bad after a reboot.
            excluded = host.excluded_until is not None and host.excluded_until > now
            move_host(host, HostState.EXCLUDED if excluded else HostState.UP if consuming else HostState.UNREACHABLE)
            record_event(
                db, EventType.HOST_UP, message=f"host {self.name} is heartbeating again", data={"host": self.name}
            )
        elif host.state == HostState.UP and not consuming:
            assert self.consumer is not None
            silent = self.consumer.silent_s()
            move_host(host, HostState.UNREACHABLE)
            record_event(
                db,
                EventType.HOST_UNREACHABLE,
                message=f"host {self.name}: its worker runs but has consumed nothing from its queue for "
                f"{silent:.0f} s (broker away, or its Celery consumer stopped); nothing is placed "
                f"on it until it consumes again",
                data={"host": self.name, "silent_s": round(silent, 1)},
            )
        elif host.state == HostState.UNREACHABLE and consuming:
            move_host(host, HostState.UP)
            record_event(
                db,
                EventType.HOST_REACHABLE,
                message=f"host {self.name} consumes its queue again",
                data={"host": self.name},
            )

    def watch_mps(self, db: Session, host: Host) -> None:
        """The host's MPS daemon, checked on every heartbeat and started again when it died; its clients are
        stopped by their supervisors as infrastructure failures (``AttemptRunner``: the generation moved)."""
        daemon = mps.DAEMON
        if daemon is None:
            host.mps = None
            return
        restarted = daemon.ensure()
        self.metrics.mps_running.set(1 if daemon.state == "running" else 0)
        if restarted:
            self.metrics.mps_restarts.inc()
            record_event(
                db,
                EventType.MPS_RESTARTED,
                message=f"host {self.name}: the MPS daemon died and was started again; "
                "its clients restart from their checkpoints",
                data={"host": self.name, "generation": daemon.generation},
            )
        host.mps = daemon.state

    def sample(self, db: Session) -> None:
        started = time.perf_counter()
        samples = self.inventory.sample()
        self.metrics.gpu_sample_seconds.observe(time.perf_counter() - started)
        if not samples:
            return
        rows = {g.uuid: g for g in db.scalars(select(GPU).join(Host).where(Host.name == self.name)).all()}
        for s in samples:
            row = rows.get(s.uuid)
            if row is None:
                continue
            row.last_sample = s.as_dict()
            if s.errors:
                self.metrics.gpu_errors.inc()
            self.metrics.gpu_healthy.labels(str(row.index)).set(0 if s.errors or not row.healthy else 1)
            if s.errors:
                row.healthy = False
                record_event(
                    db,
                    EventType.GPU_ERROR,
                    message=f"host {self.name} GPU {row.index}: {', '.join(s.errors)}",
                    data={"host": self.name, "gpu": s.uuid, "errors": s.errors},
                )
            # Unhealthy is sticky: the reconciler clears it when the host's exclusion ends (a clean sample
            # must not erase an error before the reconciler has seen it).

    def prune_files(self) -> int:
        """Delete the log and run directories of jobs finished longer ago than the retention allows, and this host's
        local-tier checkpoints of ended jobs."""
        settings = self.settings
        with session_scope() as db:
            gone = prune_job_files(db, settings.resolved_storage_dir, settings, utcnow())
            tier = settings.local_tier_dir
            cleared = prune_local_tier(db, local_tier_jobs(tier, deployment_uid(db))) if tier is not None else 0
        if gone:
            log.info("retention: removed the logs and run directories of %d finished job(s)", gone)
        if cleared:
            log.info("retention: removed the local-tier checkpoints of %d ended job(s)", cleared)
        return gone + cleared

    def _loop(self) -> None:
        next_sample = 0.0
        next_retention = 0.0  # the log files of long-finished jobs: core/retention.py
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                with session_scope() as db:
                    self.heartbeat(db)
                    if start >= next_sample:
                        next_sample = start + self.sample_interval_s
                        self.sample(db)
                if start >= next_retention:
                    next_retention = start + self.settings.retention_interval_s
                    self.prune_files()
                self.pulse.beat("heartbeat")  # after the commit: the reconciler sees this host alive
                self.metrics.heartbeat_seconds.observe(time.monotonic() - start)
                self.metrics.last_heartbeat.set_to_current_time()
            except (OperationalError, DBAPIError) as exc:
                self.metrics.heartbeat_failures.inc()
                log.warning("host heartbeat failed (database unavailable?): %s", exc)
            except Exception:
                self.metrics.heartbeat_failures.inc()
                log.exception("host agent iteration failed")
            self._stop.wait(max(0.0, self.heartbeat_interval_s - (time.monotonic() - start)))

    def sign_off(self, db: Session) -> None:
        """The worker leaves (a shutdown, ``kiln down``): its host goes DOWN at once rather than after the
        heartbeat's staleness window, so the scheduler places nothing on a host no worker serves. The next worker
        on the host brings it UP at its first heartbeat. An EXCLUDED host stays so: an exclusion outlives a
        restart."""
        host = db.scalars(select(Host).where(Host.name == self.name).with_for_update()).first()
        if host is None or host.state not in (HostState.UP, HostState.UNREACHABLE):
            return
        move_host(host, HostState.DOWN)
        record_event(
            db,
            EventType.HOST_DOWN,
            message=f"host {self.name}: its worker stopped",
            data={"host": self.name, "signed_off": True},
        )

    def leave(self) -> None:
        """Stop heartbeating and sign off; a database away at that moment leaves the host to the staleness
        window, as a crash would."""
        self.stop()
        try:
            with session_scope() as db:
                self.sign_off(db)
        except (OperationalError, DBAPIError) as exc:
            log.warning("could not sign the host off (database unavailable?): %s", exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"host-agent-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
