"""``kiln.run_attempt``: claim an attempt under its fencing token, run torchrun for it, and report how it ended.

Every write about the job happens in a transaction that first locks the job row and checks that the job's
fencing token is still this attempt's; a delivery or a worker that lost its token changes nothing but its own
attempt row. This is what makes Redis redelivery harmless and "no job runs twice" true.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery.exceptions import Reject
from celery.signals import worker_ready, worker_shutting_down
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from core import compile_cache
from core.db import session_scope, utcnow
from core.deployment import deployment_uid, local_tier_jobs
from core.event_types import EventType
from core.fence import Lease, job_checkpoint_dir, lease_clock, write_fence, write_lease
from core.lifecycle import ExitClass, end_attempt, end_attempt_as, renew_lease, stop_cause
from core.models import GPU, Attempt, Host, Job, QosClass, Team, Usage
from core.models.jobs import spec_time_limit
from core.private import private_dir, replace_file
from core.services import datasets as datasets_svc
from core.settings import Settings, get_settings
from core.states import ACTIVE, ATTEMPT_LIVE, AttemptState, JobState, MpsState
from core.trainer_protocol import (
    ENV_ATTEMPT_ID,
    ENV_CHECKPOINT_DIR,
    ENV_CKPT_WRITERS,
    ENV_COMPILE_CACHE_DIR,
    ENV_FENCING_TOKEN,
    ENV_FINAL_CHECKPOINT_RETRY_S,
    ENV_JOB_ID,
    ENV_LEASE_FILE,
    ENV_LOCAL_CHECKPOINT_DIR,
    ENV_MEMORY_FRACTION,
    ENV_SHARED_COMPILE_CACHE_DIR,
    ENV_TEAM_COMPILE_CACHE_DIR,
    ENV_TEST_HOOKS,
    LEASE_FILE,
    RecordKind,
)
from core.transitions import move_attempt, record_event, transition
from workers import attempt_setup, isolation, mps
from workers.attempt_setup import AttemptDirs, CodeRefused
from workers.celery_app import TASK_PROBE_CONSUMER, TASK_RUN_ATTEMPT, get_app
from workers.claimed import Claimed
from workers.consumer_probe import ConsumerProbe
from workers.cpu_budget import cpu_threads_per_rank
from workers.datasets import DatasetUnavailable
from workers.exit_classes import Outcome, StopRequest, classify
from workers.final_state import FinalCheckpoint, judge
from workers.metrics import WorkerMetrics
from workers.supervisor import Rendezvous, TrainerProcess, launch_command
from workers.telemetry_relay import RelayState, TelemetryTail, adopt_checkpoint, relay

log = logging.getLogger(__name__)
app = get_app()

# Set by ``python -m workers`` before the worker consumes: the host this process serves, and this process's
# incarnation (recorded on each node it claims: a later worker process on the host knows it was not its own).
CURRENT_HOST: str | None = None
WORKER_INCARNATION: str | None = None
HOST_GPUS = 0  # the GPUs of this worker's host, set by ``python -m workers`` (a rank's part of the host's cores)
METRICS = WorkerMetrics()  # this worker process's (its host agent's too); served by workers.__main__
# Set when the worker starts a warm shutdown: running attempts checkpoint and go back to the queue.
SHUTTING_DOWN = threading.Event()
# Set by ``python -m workers``: the probe that tells the host agent whether this process's consumer consumes.
CONSUMER_PROBE: ConsumerProbe | None = None

POLL_S = 0.25  # how often the supervisor looks at the trainer and its telemetry
EVAL_BEAT_S = 1.0  # an evaluation's own heartbeat comes no sooner than this after the last heartbeat
RDZV_PORT_SPAN = 20000  # gang jobs: node 0's c10d store listens on settings.rendezvous_port_base + id % span
NCCL_MAX_CHANNELS = 32
HOST_ENV = ("LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
HOST_ENV_PREFIXES = ("LC_", "NCCL_", "GLOO_", "NVIDIA_")
DEFAULT_LINK_BYTES_PER_S = {"pcie": 64 * 10**9, "nvlink": 900 * 10**9}  # PCIe 5 x16; H100/H200 NVLink 4


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    SHUTTING_DOWN.set()


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    if CONSUMER_PROBE is not None:  # the consumer has connected and consumes from now on
        CONSUMER_PROBE.seen()


class Supervisions:
    """The threads supervising this process's running attempts. They belong to the worker process, not to Celery's
    pool: a Celery consumer that dies (and is started again, ``python -m workers``) leaves them running, and a
    warm shutdown waits for them (``join``) after the consumer has stopped."""

    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, name: str, target: Callable[[], object]) -> None:
        def run() -> None:
            try:
                target()
            except Exception:
                log.exception("supervision %s failed", name)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def running(self) -> int:
        with self._lock:
            return len(self._threads)

    def join(self, timeout_s: float) -> bool:
        """Wait for every supervision to end (at most ``timeout_s``); True when none is left."""
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return self.running() == 0


SUPERVISIONS = Supervisions()


class Refused(Exception):
    """This delivery may not run the attempt (stale token, already claimed, job gone)."""


# ----------------------------------------------------------------------------------------------------- claim


def _lock_attempt_and_job(db: Session, attempt_id: int) -> tuple[Attempt | None, Job | None]:
    # The job row first (the reconciler and the scheduler lock in the same order), then the attempt.
    job_id = db.scalar(select(Attempt.job_id).where(Attempt.id == attempt_id))
    if job_id is None:
        return None, None
    job = db.get(Job, job_id, with_for_update=True, populate_existing=True)
    # SQLite ignores FOR UPDATE; touching the row first takes its write lock there too, so two deliveries
    # racing on the embedded default serialise here as they do on PostgreSQL.
    db.execute(update(Attempt).where(Attempt.id == attempt_id).values(number=Attempt.number))
    attempt = db.get(Attempt, attempt_id, with_for_update=True, populate_existing=True)
    return attempt, job


def claim(
    db: Session, *, attempt_id: int, token: int, node_rank: int, host: str, delivery: str, settings: Settings
) -> Claimed:
    """Exactly one delivery per (attempt, node) wins; the others raise Refused (and leave an event)."""
    now = utcnow()
    attempt, job = _lock_attempt_and_job(db, attempt_id)
    if attempt is None or job is None:
        raise Refused(f"attempt {attempt_id} does not exist")

    def refuse(why: str) -> Refused:
        record_event(
            db,
            EventType.DELIVERY_REFUSED,
            job=job,
            message=f"delivery of attempt {attempt.number} refused: {why}",
            data={
                "attempt_id": attempt.id,
                "token": token,
                "current_token": job.fencing_token,
                "node_rank": node_rank,
                "host": host,
                "delivery": delivery,
                "reason": why,
            },
        )
        return Refused(why)

    if attempt.fencing_token != token or job.fencing_token != token:
        raise refuse(f"stale fencing token {token} (current {job.fencing_token})")
    if attempt.state not in ATTEMPT_LIVE:
        raise refuse(f"attempt already ended ({attempt.state})")
    placement = [dict(n) for n in attempt.placement or []]
    if not 0 <= node_rank < len(placement):
        raise refuse(f"node_rank {node_rank} is not in the placement")
    node = placement[node_rank]
    if node.get("host") != host:
        raise refuse(f"node {node_rank} is placed on {node.get('host')}, not on {host}")
    if node.get("claimed_by"):
        raise refuse(f"node {node_rank} already started by delivery {node['claimed_by']}")
    if job.state not in (JobState.ADMITTED, JobState.RUNNING):
        raise refuse(f"job is {job.state}")
    if job.cancel_requested:
        why = f"{stop_cause(job)}, before it started"
        job.exit_reason = why[:512]
        transition(db, job, JobState.CANCELLED, message=why, data={"attempt": attempt.number})
        end_attempt(db, attempt, state=AttemptState.CANCELLED, reason=why, now=now)
        raise Refused(why)

    node["claimed_by"] = delivery
    node["claimed_at"] = now.isoformat()
    node["worker"] = WORKER_INCARNATION
    attempt.placement = placement  # a new list, so the JSON column is written
    if attempt.state == AttemptState.PENDING:
        move_attempt(attempt, AttemptState.RUNNING)
        attempt.started_at = now
    renew_lease(attempt, node_rank=node_rank, now=now, lease_s=settings.lease_s)
    host_isolation = isolation.current(host, settings)
    if host_isolation.mode != "sandbox":  # the operator turned it off, or a kiln recipe on a host that cannot
        record_event(
            db,
            EventType.UNSANDBOXED,
            job=job,
            message=f"attempt {attempt.number} runs without a sandbox on {host}: {host_isolation.describe_sandbox()}",
            data={"attempt": attempt.number, "host": host},
        )
    if job.state == JobState.ADMITTED:
        transition(
            db,
            job,
            JobState.RUNNING,
            message=f"attempt {attempt.number} started on {host}",
            data={"attempt": attempt.number, "host": host, "token": token},
        )

    gpus = list(db.scalars(select(GPU).where(GPU.uuid.in_(node.get("gpus") or []))).all())
    gpus.sort(key=lambda g: (node.get("gpus") or []).index(g.uuid))
    host_row = db.scalars(select(Host).where(Host.name == host)).first()
    qos = db.get(QosClass, job.qos_class_id)
    if node_rank == 0 and db.scalar(select(Usage.id).where(Usage.attempt_id == attempt.id)) is None:
        # Node 0 accounts for the whole placement (one usage row per attempt).
        all_gpus = [u for n in placement for u in n.get("gpus") or []]
        gpu_type = gpus[0].model if gpus else "cpu"
        units = len(all_gpus) if all_gpus else sum(int(n.get("slots") or 1) for n in placement)
        db.add(
            Usage(
                team_id=job.team_id,
                job_id=job.id,
                attempt_id=attempt.id,
                gpu_type=gpu_type,
                gpus=units,
                gpu_seconds=0.0,
                started_at=now,
            )
        )

    rendezvous = None
    if len(placement) > 1:
        head = placement[0]
        head_host = db.scalars(select(Host).where(Host.name == head.get("host"))).first()
        address = head.get("address") or (head_host.address if head_host and head_host.address else head["host"])
        port = settings.rendezvous_port_base + attempt.id % RDZV_PORT_SPAN
        rendezvous = Rendezvous(
            nnodes=len(placement),
            node_rank=node_rank,
            endpoint=f"{address}:{port}",
            run_id=f"kiln-{job.id}-{attempt.number}",
        )

    names = [str(n) for n in (job.spec or {}).get("datasets") or []]
    team = db.get(Team, job.team_id)
    return Claimed(
        job_id=job.id,
        team_id=job.team_id,
        attempt_number=attempt.number,
        spec=dict(job.spec or {}),
        placement=placement,
        gpus=gpus,
        qos=qos,
        host_links=dict(host_row.links or {}) if host_row else {},
        rendezvous=rendezvous,
        ran_before_s=job.ran_s(now, besides=attempt.id),
        team=team.name if team is not None else "",
        address=host_row.address if host_row is not None else None,
        datasets=datasets_svc.paths_for(db, team_id=job.team_id, names=names),
        deployment=deployment_uid(db),
    )


# ----------------------------------------------------------------------------------------------- environment


def _nccl_channels(qos: QosClass | None, links: dict[str, Any], gpus: list[GPU]) -> int | None:
    """A bandwidth quota as an NCCL channel limit: the quota's share of the link, of NCCL's 32 channels."""
    if qos is None or not gpus:
        return None
    shares = []
    for kind, quota in (("pcie", qos.pcie_bandwidth_bytes_per_s), ("nvlink", qos.nvlink_bandwidth_bytes_per_s)):
        if not quota:
            continue
        if kind == "nvlink" and not any(g.nvlink_peers for g in gpus):
            continue
        capacity = float(links.get(f"{kind}_bytes_per_s") or DEFAULT_LINK_BYTES_PER_S[kind])
        shares.append(min(1.0, quota / capacity))
    if not shares:
        return None
    return max(1, min(NCCL_MAX_CHANNELS, int(NCCL_MAX_CHANNELS * min(shares))))


def attempt_env(
    claimed: Claimed,
    *,
    attempt_id: int,
    token: int,
    checkpoint_dir: Path,
    compile_dir: Path,
    lease_file: Path,
    local_dir: Path | None = None,
    final_retry_s: float | None = None,
    team_cache_dir: Path | None = None,
    shared_cache_dir: Path | None = None,
    ckpt_writers: int | None = None,
) -> dict[str, str]:
    # Built from nothing: the worker's own environment (its KILN_* settings, database and broker URLs that may hold
    # passwords, whatever its service manager set) is not the attempt's. From the host: the locale, time zone and
    # library path, and the operator's NCCL/gloo/NVIDIA tuning of the host's network and devices.
    env = {k: v for k, v in os.environ.items() if k in HOST_ENV or k.startswith(HOST_ENV_PREFIXES)}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
    if ENV_TEST_HOOKS in os.environ:  # the test harness's fault injection reaches the ranks only this way
        env[ENV_TEST_HOOKS] = os.environ[ENV_TEST_HOOKS]
    env.update(
        {
            ENV_FENCING_TOKEN: str(token),
            ENV_CHECKPOINT_DIR: str(checkpoint_dir),
            ENV_COMPILE_CACHE_DIR: str(compile_dir),
            ENV_LEASE_FILE: str(lease_file),
            ENV_JOB_ID: str(claimed.job_id),
            ENV_ATTEMPT_ID: str(attempt_id),
            "PYTHONUNBUFFERED": "1",  # the log streams live to `kiln logs -f`
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in claimed.gpus),  # empty: a CPU job sees no GPU
            "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP multicast is not shared safely between tenants
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a failed peer raises (-> ExitCode.NCCL_ERROR), never hangs
        }
    )
    if local_dir is not None:
        env[ENV_LOCAL_CHECKPOINT_DIR] = str(local_dir)
    if team_cache_dir is not None:  # the team's compile cache: every job and host of the team reuses its entries
        env[ENV_TEAM_COMPILE_CACHE_DIR] = str(team_cache_dir)
    if shared_cache_dir is not None:
        env[ENV_SHARED_COMPILE_CACHE_DIR] = str(shared_cache_dir)
    if final_retry_s is not None:  # the worker's setting; the ranks default to the same value without it
        env[ENV_FINAL_CHECKPOINT_RETRY_S] = f"{final_retry_s:g}"
    if ckpt_writers is not None:  # the worker's setting; without it each rank picks min(8, its cores)
        env[ENV_CKPT_WRITERS] = str(ckpt_writers)
    if not claimed.gpus:
        # A CPU slot is one core: without this every rank starts a thread per core and they all fight.
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    qos = claimed.qos
    share = next((n["share"] for n in claimed.placement if n.get("share")), None)
    # A share's part of its one GPU, by memory (what MPS pins); a whole GPU is all of it.
    fraction = min(1.0, int(share["memory_bytes"]) / claimed.gpus[0].memory_bytes) if share and claimed.gpus else 1.0
    if claimed.gpus:
        threads = cpu_threads_per_rank(
            cores=len(os.sched_getaffinity(0)), host_gpus=max(HOST_GPUS, len(claimed.gpus)), gpu_fraction=fraction
        )
        env["OMP_NUM_THREADS"] = str(threads)
    if claimed.gpus and share is not None:
        # A fractional job: its share is what MPS enforces (memory pinned, SMs capped), as this GPU's client.
        memory = int(share["memory_bytes"])
        env[ENV_MEMORY_FRACTION] = f"{fraction:.6f}"
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory // 2**20}M"
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(share["sm_percent"]))
        # A best-effort share fills idle SMs: below-normal MPS priority lets a guaranteed neighbour's kernels go
        # first (the H200 run: a gold job kept 0.72x of alone beside a 30% best-effort job at equal priority).
        env["CUDA_MPS_CLIENT_PRIORITY"] = "0" if share.get("guaranteed") else "1"
        if mps.DAEMON is not None:
            env.update(mps.DAEMON.client_env())
    elif claimed.gpus and qos is not None:
        smallest = min(g.memory_bytes for g in claimed.gpus)
        if qos.gpu_memory_cap_bytes:
            env[ENV_MEMORY_FRACTION] = f"{min(1.0, qos.gpu_memory_cap_bytes / smallest):.6f}"
            mib = qos.gpu_memory_cap_bytes // 2**20
            # Index-based (as the client sees the devices after CUDA_VISIBLE_DEVICES); enforced where MPS runs.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i in range(len(claimed.gpus)))
        else:
            env[ENV_MEMORY_FRACTION] = "1.0"
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(qos.sm_percent)
        channels = _nccl_channels(qos, claimed.host_links, claimed.gpus)
        if channels is not None:
            env["NCCL_MAX_NCHANNELS"] = str(channels)
    return env


def local_tier_dir(settings: Settings, claimed: Claimed) -> Path | None:
    """The job's own directory in this host's fast local tier, when its spec asks for the tier and the host has
    one: the worker names it (the spec names no path), the same for every attempt of the job on this host. The
    tier is the host's, shared by every kiln database on it, so each keeps its jobs under its own uid: another
    database's job of the same number (a recreated database, a second kiln) never resumes from this one's."""
    wanted = bool(((claimed.spec or {}).get("checkpointing") or {}).get("local_tier"))
    if not wanted or settings.local_tier_dir is None:
        return None
    return local_tier_jobs(settings.local_tier_dir, claimed.deployment) / str(claimed.job_id)


# ------------------------------------------------------------------------------------------------ supervision


@dataclass
class Directive:
    fenced: bool = False
    cancel: bool = False
    preempt: bool = False
    held: bool = False  # the preemption is a user's hold (kiln hold on a running job)
    time_limit_s: float | None = None  # the job's time limit now, read when renewed_at is set (kiln update)
    renewed_at: float | None = None  # lease_clock() before the transaction that renewed the database lease


class AttemptRunner:
    """Supervises one node of one attempt from launch to the final report."""

    def __init__(
        self,
        *,
        attempt_id: int,
        token: int,
        node_rank: int,
        host: str,
        settings: Settings,
        claimed: Claimed,
        proc: TrainerProcess,
    ):
        self.attempt_id = attempt_id
        self.token = token
        self.node_rank = node_rank
        self.host = host
        self.settings = settings
        self.claimed = claimed
        self.proc = proc
        self.tail = TelemetryTail(proc.run_dir)
        self.relay_state = RelayState()
        self.buffer: list[dict[str, Any]] = []
        self.stop: StopRequest | None = None
        self.fenced = False
        self.progress_step = -1  # the furthest step any record showed (see ``note_progress``)
        self.last_progress = time.monotonic()
        self.rank_errors: dict[int, str] = {}  # the exception line each rank's EXIT record gave, if any
        self.final: FinalCheckpoint | None = None  # what a success's result is read from (``durable_outcome``)
        # A fractional job is a client of the host's MPS daemon of this generation (workers/mps.py).
        self.share: dict[str, Any] | None = next((n["share"] for n in claimed.placement if n.get("share")), None)
        self.mps_generation = mps.DAEMON.generation if self.share and mps.DAEMON is not None else None

    def mps_restarted(self) -> bool:
        daemon = mps.DAEMON
        return self.mps_generation is not None and daemon is not None and daemon.generation != self.mps_generation

    def lost_mps_server(self, outcome: Outcome) -> bool:
        """A share's attempt that ended badly while its MPS daemon died (or was restarted) failed with it: an
        infrastructure failure whatever the trainer said (a CUDA error would otherwise read as the user's)."""
        if self.mps_generation is None or outcome.exit_class in (
            ExitClass.SUCCEEDED,
            ExitClass.CANCELLED,
            ExitClass.PREEMPTED,
            ExitClass.DRAINED,
        ):
            return False
        daemon = mps.DAEMON
        return self.mps_restarted() or daemon is None or not daemon.healthy()

    def renew_lease(self, at: float) -> None:
        """Hand the ranks the lease the database just granted (never longer: see ``core.fence``)."""
        lease = Lease.renewed(token=self.token, at=at, lease_s=self.settings.lease_s)
        try:
            write_lease(self.proc.run_dir / LEASE_FILE, lease)
        except OSError as exc:  # the ranks stop at the old expiry and wait: safe, and logged
            log.warning("could not renew the lease file of attempt %s: %s", self.attempt_id, exc)

    def read_telemetry(self) -> list[dict[str, Any]]:
        records = self.tail.read_new()
        for rec in records:
            if rec.get("kind") == RecordKind.EVENT and rec.get("type") == EventType.EXIT:
                error = (rec.get("fields") or {}).get("error")
                if error:
                    self.rank_errors[int(rec.get("rank") or 0)] = str(error)
        return records

    def note_progress(self, records: list[dict[str, Any]]) -> None:
        """Training moves while a record other than a heartbeat or a GPU sample arrives (a step, a checkpoint, an
        event) or a heartbeat shows a further step. A heartbeat that repeats its step is the trainer's heartbeat
        thread ticking beside a loop that may be stuck (a hung collective keeps it alive): not progress."""
        for rec in records:
            kind = rec.get("kind")
            step = rec.get("step")
            further = isinstance(step, int) and step > self.progress_step
            if isinstance(step, int) and further:
                self.progress_step = step
            if further or kind not in (RecordKind.HEARTBEAT, RecordKind.GPU_SAMPLE):
                self.last_progress = time.monotonic()

    # One heartbeat transaction: check the token, renew the lease, relay telemetry, read cancel/preempt flags.
    def heartbeat(self) -> Directive:
        started = lease_clock()
        now = utcnow()
        records, self.buffer = self.buffer, []
        try:
            with session_scope() as db:
                job = db.get(Job, self.claimed.job_id, with_for_update=True, populate_existing=True)
                attempt = db.get(Attempt, self.attempt_id, populate_existing=True)
                if job is None or attempt is None or job.fencing_token != self.token:
                    return Directive(fenced=True)
                if attempt.state != AttemptState.RUNNING:
                    return Directive(fenced=True)
                renew_lease(attempt, node_rank=self.node_rank, now=now, lease_s=self.settings.lease_s)
                relay(db, job=job, attempt=attempt, records=records, state=self.relay_state, asked=self.own_stop())
                if self.node_rank == 0:
                    usage = db.scalars(select(Usage).where(Usage.attempt_id == attempt.id)).first()
                    if usage is not None:
                        usage.gpu_seconds = usage.gpus * (now - usage.started_at).total_seconds()
                return Directive(
                    cancel=job.cancel_requested,
                    preempt=job.preempt_requested or job.state == JobState.PREEMPTING,
                    held=job.held_at is not None,
                    time_limit_s=job.time_limit_s,
                    renewed_at=started,  # committed on the way out of the block; a failed commit returns below
                )
        except (OperationalError, DBAPIError) as exc:
            # PostgreSQL is away: keep training and keep the telemetry for the next heartbeat.
            self.buffer = records + self.buffer
            log.warning("heartbeat of attempt %s failed (database unavailable?): %s", self.attempt_id, exc)
            return Directive()

    def deadline(self, launched: float, limit: float | None) -> float | None:
        """When (``time.monotonic()``) the time limit stops this attempt: the limit counts every attempt's run."""
        return None if limit is None else launched + max(0.0, limit - self.claimed.ran_before_s)

    def own_stop(self) -> str | None:
        """Why this worker stopped the trainer on its own account (the time limit, a hang, its shutdown); None when
        it did not, or when the job was asked to stop (a preemption, a hold, a cancel: the relay reads the job)."""
        stop = self.stop
        if stop is None or stop.reason in (ExitClass.PREEMPTED, ExitClass.CANCELLED):
            return None
        return stop.why or None

    def request_stop(self, reason: ExitClass, why: str) -> None:
        if self.stop is not None:
            return
        self.stop = StopRequest(reason, why)
        self.proc.log_line(f"stopping the trainer ({why}): SIGTERM, SIGKILL after {self.settings.stop_grace_s:.0f} s")
        self.proc.terminate()

    def supervise(self) -> int:
        hb = self.settings.heartbeat_interval_s
        next_beat = time.monotonic()  # the first heartbeat right away: RUNNING is visible at once
        last_beat = float("-inf")
        launched = time.monotonic()
        limit = spec_time_limit(self.claimed.spec)
        deadline = self.deadline(launched, limit)
        while True:
            code = self.proc.poll()
            new = self.read_telemetry()
            mono = time.monotonic()
            if new:
                self.note_progress(new)
                self.buffer.extend(new)
                if any(rec.get("kind") == RecordKind.EVAL for rec in new):
                    # An evaluation goes out at once, not at the next heartbeat: its sweep's early stopping judges
                    # it there, and a fast job would otherwise train on, or end, before the answer came back. At
                    # most one such heartbeat a second: code that evaluates every step does not load the database.
                    next_beat = min(next_beat, max(mono, last_beat + EVAL_BEAT_S))
            if code is not None:
                return code
            self.proc.refresh_tree()
            if mono >= next_beat:
                next_beat, last_beat = mono + hb, mono
                d = self.heartbeat()
                if d.renewed_at is not None:
                    self.renew_lease(d.renewed_at)
                if d.fenced and not self.fenced:
                    self.fenced = True
                    self.request_stop(ExitClass.FENCED, "the fencing token moved on: another attempt owns the job")
                elif d.cancel:
                    self.request_stop(ExitClass.CANCELLED, "cancel requested")
                elif d.preempt:
                    why = "held by the user" if d.held else "preemption requested by the scheduler"
                    self.request_stop(ExitClass.PREEMPTED, why)
                # A heartbeat that renewed the lease read the job, its limit too (kiln update may change it).
                if d.renewed_at is not None and d.time_limit_s != limit:
                    limit = d.time_limit_s
                    deadline = self.deadline(launched, limit)
                    self.proc.log_line(f"time limit now {'none' if limit is None else f'{limit:g} s'}")
            if deadline is not None and mono >= deadline:
                self.request_stop(ExitClass.TIMEOUT, "time limit reached")
            if SHUTTING_DOWN.is_set():
                self.request_stop(ExitClass.DRAINED, "the worker is shutting down")
            if self.mps_restarted():
                self.request_stop(ExitClass.INFRASTRUCTURE, "the host's MPS daemon died: this job's GPU share is gone")
            hang_s = self.settings.hang_timeout_s
            if self.stop is None and self.relay_state.first_step_seen and mono - self.last_progress > hang_s:
                self.request_stop(ExitClass.INFRASTRUCTURE, f"no training progress for {hang_s:g} s: hung")
            if (
                self.proc.term_sent_at is not None
                and not self.proc.killed
                and mono - self.proc.term_sent_at > self.settings.stop_grace_s
            ):
                self.proc.log_line("grace period over: SIGKILL")
                self.proc.kill_tree()
            time.sleep(POLL_S)

    def finish(self, launcher_code: int, forced: Outcome | None = None) -> Outcome:
        left = self.proc.reap_leftovers()
        if left:
            self.proc.log_line(f"killed ranks left behind by torchrun: {left}")
        self.buffer.extend(self.read_telemetry())
        slots = self.claimed.slots(self.node_rank)
        outcome = forced or classify(
            self.proc.rank_exit_codes(),
            launcher_code,
            self.stop,
            self.rank_errors,
            ranks=range(slots) if self.claimed.rendezvous is None else None,  # a gang's ranks: set at its rendezvous
            backend="NCCL" if self.claimed.gpus else "gloo",
        )
        confinement = self.proc.confinement
        if outcome.exit_class is ExitClass.INFRASTRUCTURE and confinement is not None and confinement.oom_killed():
            limit = confinement.limits.memory_bytes
            outcome = Outcome(
                ExitClass.OOM,
                f"out of host memory: the job went over its limit of {limit} bytes "
                f"(resources.host_memory_bytes) and was killed ({outcome.reason})",
            )
        if self.lost_mps_server(outcome):
            why = f"the host's MPS daemon died and took this job's GPU share with it ({outcome.reason})"
            outcome = Outcome(ExitClass.INFRASTRUCTURE, why)
        elif self.share is not None and outcome.exit_class is ExitClass.OOM and outcome.reason.startswith("out of mem"):
            # MPS pins a share's memory: the job that went over it fails alone, its neighbours train on.
            gib = int(self.share["memory_bytes"]) / 2**30
            outcome = Outcome(
                ExitClass.OOM,
                f"out of GPU memory: over its share of {gib:.1f} GiB "
                f"(resources.gpu_share.memory_gb) ({outcome.reason})",
            )
        if outcome.exit_class is ExitClass.INFRASTRUCTURE and self.relay_state.nccl_error:
            outcome = Outcome(ExitClass.NCCL_ERROR, f"NCCL error reported by a rank; {outcome.reason}")
        outcome = self.durable_outcome(outcome)
        kind, why = outcome.exit_class.value, outcome.reason
        said = why if why.startswith(kind) else f"{kind}: {why}"  # a reason often begins with its class already
        self.proc.log_line(f"trainer exited with {launcher_code}: {said}")
        give_up = time.monotonic() + self.settings.report_retry_window_s
        delay = 0.5
        while True:
            try:
                with session_scope() as db:
                    self._report(db, outcome, launcher_code)
                self.buffer = []  # relayed only once the report committed: a failed commit relays them again
                return outcome
            except (OperationalError, DBAPIError) as exc:
                if time.monotonic() > give_up:
                    # The lease has long expired; the reconciler has handled the job as LOST.
                    log.error("could not report attempt %s: %s", self.attempt_id, exc)
                    return outcome
                log.warning("report of attempt %s failed, retrying: %s", self.attempt_id, exc)
                time.sleep(delay)
                delay = min(5.0, delay * 2)

    def durable_outcome(self, outcome: Outcome) -> Outcome:
        """A success stands only on its final checkpoint, verified on the durable storage (``workers.final_state``):
        without it the attempt is an infrastructure failure and the job restarts from its last verified one. Run
        before the report's transaction: it hashes the checkpoint's files."""
        done = next(
            (r for r in reversed(self.buffer) if r.get("kind") == RecordKind.DONE and not r.get("rank")),
            self.relay_state.done,
        )
        if outcome.exit_class is not ExitClass.SUCCEEDED or done is None:
            return outcome  # not a success, or a gang's node whose ranks did not include rank 0
        script = bool(self.claimed.spec.get("command"))
        steps = done.get("steps")
        root = job_checkpoint_dir(self.settings.resolved_storage_dir.resolve(), self.claimed.job_id)
        verdict = judge(root, final_step=None if script or steps is None else int(steps))
        if verdict.problem is not None:
            self.proc.log_line(f"not a success: {verdict.problem}")
            return Outcome(ExitClass.INFRASTRUCTURE, verdict.problem)
        self.final = verdict.final
        return outcome

    def _report(self, db: Session, outcome: Outcome, launcher_code: int) -> None:
        now = utcnow()
        job = db.get(Job, self.claimed.job_id, with_for_update=True, populate_existing=True)
        attempt = db.get(Attempt, self.attempt_id, populate_existing=True)
        assert job is not None and attempt is not None
        rank_codes = self.proc.rank_exit_codes()
        exit_code = rank_codes.get(0, launcher_code) if rank_codes else launcher_code
        owner = job.fencing_token == self.token and attempt.state == AttemptState.RUNNING
        if not owner:
            # Fenced: only our own attempt row, and only if nobody ended it already.
            if attempt.ended_at is None:
                end_attempt(db, attempt, state=AttemptState.FENCED, reason=outcome.reason, now=now, exit_code=exit_code)
            return
        relay(
            db,
            job=job,
            attempt=attempt,
            records=self.buffer,
            state=self.relay_state,
            asked=self.own_stop(),
            running=False,
        )
        if job.state not in ACTIVE:
            # Another node of the same gang reported first.
            return
        cls = outcome.exit_class
        if cls is ExitClass.SUCCEEDED and len(self.claimed.placement) > 1 and self.relay_state.done is None:
            # A gang's global ranks are assigned at the rendezvous, not by node: another node ran rank 0, whose
            # final record (step, loss) is the job's result. Its report ends the attempt; if it never comes, the
            # lease does, and the restart resumes from the final checkpoint and trains no step.
            self.proc.log_line("this node's ranks finished; the node that ran rank 0 reports the job's result")
            return
        data = {
            "attempt": attempt.number,
            "host": self.host,
            "exit_code": exit_code,
            "last_step": job.last_step,
            "exit_class": cls.value,
        }
        done = self.relay_state.done
        if cls is ExitClass.SUCCEEDED and self.final is not None:
            # What the durable storage holds, verified (``durable_outcome``): its row too, if its relay was missed.
            adopt_checkpoint(db, job=job, rec=self.final.record, step=self.final.step)
            job.last_step, job.last_loss = self.final.step, self.final.loss
        elif cls is ExitClass.SUCCEEDED and done is not None and done.get("steps") is not None:
            # The trainer's final record is its last checkpoint's step and loss (also when it resumed from
            # the final checkpoint and trained no step): the job's result is what its checkpoint holds.
            job.last_step = int(done["steps"])
            job.last_loss = done.get("final_loss")
        end_attempt_as(
            db,
            job=job,
            attempt=attempt,
            exit_class=cls,
            reason=outcome.reason,
            now=now,
            exit_code=exit_code,
            data=data,
            settings=self.settings,
        )


# ------------------------------------------------------------------------------------------------------- task


def claim_delivery(
    *, attempt_id: int, fencing_token: int, node_rank: int, host: str, delivery: str, settings: Settings
) -> tuple[Claimed, float] | None:
    """Claim in its own committed transaction: the claim and the lease clock read before it, or None if refused."""
    refused: Refused | None = None
    isolation.current(host, settings)  # detected (a probe process) before the claim's transaction, never in it
    claimed_at = lease_clock()  # before the claim's transaction: the lease file never outlasts its lease
    with session_scope() as db:
        try:
            claimed = claim(
                db,
                attempt_id=attempt_id,
                token=fencing_token,
                node_rank=node_rank,
                host=host,
                delivery=delivery,
                settings=settings,
            )
        except Refused as exc:
            refused = exc  # caught inside the transaction: the refusal's event (or cancel) is committed
    if refused is not None:
        log.warning("attempt %s node %s refused on %s: %s", attempt_id, node_rank, host, refused)
        return None
    return claimed, claimed_at


def run_claimed(
    *,
    claimed: Claimed,
    claimed_at: float,
    attempt_id: int,
    fencing_token: int,
    node_rank: int,
    host: str,
    settings: Settings,
) -> str:
    """Launch the claimed node's trainer, supervise it to its end and report; returns the exit class. Counted in
    the worker's metrics (attempts running, and ended by outcome)."""
    METRICS.attempts_running.inc()
    outcome = "error"
    try:
        outcome = _run_claimed(
            claimed=claimed,
            claimed_at=claimed_at,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
            node_rank=node_rank,
            host=host,
            settings=settings,
        )
        return outcome
    finally:
        METRICS.attempts_running.dec()
        METRICS.attempts.labels(outcome).inc()


def _run_claimed(
    *,
    claimed: Claimed,
    claimed_at: float,
    attempt_id: int,
    fencing_token: int,
    node_rank: int,
    host: str,
    settings: Settings,
) -> str:
    storage = settings.resolved_storage_dir.resolve()
    suffix = "" if node_rank == 0 else f".node{node_rank}"
    run_dir = storage / "runs" / str(claimed.job_id) / f"{claimed.attempt_number}{suffix}"
    log_path = storage / "logs" / str(claimed.job_id) / f"{claimed.attempt_number}{suffix}.log"
    checkpoint_dir = job_checkpoint_dir(storage, claimed.job_id)
    compile_dir = storage / "compile_cache" / str(claimed.job_id)
    team_cache = compile_cache.team_dir(storage, claimed.team_id)  # this team's only: never another's
    shared_cache = compile_cache.shared_dir(storage) if compile_cache.shared_dir(storage).is_dir() else None
    local_dir = local_tier_dir(settings, claimed)
    node = claimed.placement[node_rank]
    slots = claimed.slots(node_rank)
    spec_path = run_dir / "spec.json"
    argv, launch_env = launch_command(
        nproc_per_node=slots,
        spec_path=spec_path,
        run_dir=run_dir,
        rendezvous=claimed.rendezvous,
        script=bool(claimed.spec.get("command")),
    )
    env = (
        attempt_env(
            claimed,
            attempt_id=attempt_id,
            token=fencing_token,
            checkpoint_dir=checkpoint_dir,
            compile_dir=compile_dir,
            lease_file=run_dir / LEASE_FILE,
            local_dir=local_dir,
            final_retry_s=settings.final_checkpoint_retry_s,
            team_cache_dir=team_cache,
            shared_cache_dir=shared_cache,
            ckpt_writers=settings.ckpt_writers,
        )
        | launch_env
    )
    host_isolation = isolation.current(host, settings)
    limits = host_isolation.limits(claimed.spec, slots)
    proc = TrainerProcess(argv, env=env, log_path=log_path, run_dir=run_dir, cwd=run_dir, log_gid=settings.storage_gid)
    runner = AttemptRunner(
        attempt_id=attempt_id,
        token=fencing_token,
        node_rank=node_rank,
        host=host,
        settings=settings,
        claimed=claimed,
        proc=proc,
    )
    dirs = AttemptDirs(
        storage=storage,
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        compile_dir=compile_dir,
        team_cache_dir=team_cache,
        shared_cache_dir=shared_cache,
        local_dir=local_dir,
        local_root=settings.local_tier_dir.resolve() if local_dir and settings.local_tier_dir else None,
    )
    try:
        # Everything between the claim and a running trainer: a failure here must end the attempt now (as an
        # infrastructure failure on this host), not leave it RUNNING until its lease runs out.
        for d in (run_dir, compile_dir, team_cache, *([local_dir] if local_dir else [])):
            private_dir(d)
        if node.get("share") and (mps.DAEMON is None or mps.DAEMON.state != MpsState.RUNNING):
            raise RuntimeError("this host's MPS daemon is not running: a GPU share cannot be enforced")
        write_fence(checkpoint_dir, fencing_token)
        runner.renew_lease(claimed_at)  # the lease the claim granted, before any rank starts
        replace_file(spec_path, json.dumps(claimed.spec, indent=2, sort_keys=True))
        attempt_setup.prepare(proc, claimed, dirs, host_isolation, settings)
        proc.log_line(f"attempt {claimed.attempt_number} (token {fencing_token}) node {node_rank} on {host}")
        if ENV_TEST_HOOKS in env:
            proc.log_line(f"TEST HOOKS ACTIVE ({ENV_TEST_HOOKS} is set on this worker): {env[ENV_TEST_HOOKS]}")
        proc.confinement = host_isolation.confine(f"attempt-{attempt_id}{suffix}", limits)
        proc.log_line(
            f"limits ({host_isolation.mechanism}): {limits.memory_bytes} bytes of host memory, {limits.pids} processes"
        )
        proc.start()
    except Exception as exc:
        if isinstance(exc, DatasetUnavailable | CodeRefused):  # the user's to fix: a restart fails the same way
            forced = Outcome(ExitClass.USER_ERROR, f"user error: {exc}"[:480])
        else:
            log.exception("could not launch attempt %s", attempt_id)
            forced = Outcome(ExitClass.INFRASTRUCTURE, f"launch failed on {host}: {exc!r}"[:480])
        with contextlib.suppress(Exception):
            proc.log_line(f"could not launch the trainer: {forced.reason}")
        try:
            return runner.finish(127, forced).exit_class.value
        finally:
            _release(proc)
    try:
        code = runner.supervise()
    except BaseException:
        proc.kill_tree()
        _release(proc)
        raise
    proc.wait()
    outcome = runner.finish(code)
    _release(proc)
    log.info("attempt %s node %s: %s (%s)", attempt_id, node_rank, outcome.exit_class.value, outcome.reason)
    return outcome.exit_class.value


def _release(proc: TrainerProcess) -> None:
    if proc.confinement is not None:
        with contextlib.suppress(Exception):
            proc.confinement.release()


@app.task(name=TASK_RUN_ATTEMPT, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_attempt(self: Any, attempt_id: int, fencing_token: int, node_rank: int = 0) -> str:
    """Claim, then hand the attempt to a supervision thread of the worker process and return: the message is
    acknowledged once the claim is committed (see ``workers.celery_app``), and the consumer's life is no longer
    tied to the attempt's (hours)."""
    host = CURRENT_HOST or ""
    delivery = str(getattr(self.request, "id", "") or "")
    redelivered = bool((getattr(self.request, "delivery_info", None) or {}).get("redelivered"))
    if redelivered:
        delivery += ":redelivered"
    if SHUTTING_DOWN.is_set():
        # A delivery that reaches a worker in its warm shutdown goes back to the host's queue unclaimed, for the
        # worker that comes back (or the reconciler, if none does): claimed here, it would start a trainer only to
        # drain it at once (an extra DRAINED attempt, test_a_worker_shutting_down_drains_its_attempts...).
        time.sleep(1.0)  # not a hot loop of redeliveries while this consumer still consumes
        raise Reject("the worker is shutting down", requeue=True)
    settings = get_settings()
    _hold_delivery_for_a_test(attempt_id)
    won = claim_delivery(
        attempt_id=attempt_id,
        fencing_token=fencing_token,
        node_rank=node_rank,
        host=host,
        delivery=delivery,
        settings=settings,
    )
    if won is None:
        return "refused"
    claimed, claimed_at = won
    SUPERVISIONS.start(
        f"attempt-{attempt_id}-node{node_rank}",
        functools.partial(
            run_claimed,
            claimed=claimed,
            claimed_at=claimed_at,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
            node_rank=node_rank,
            host=host,
            settings=settings,
        ),
    )
    return "started"


def _hold_delivery_for_a_test(attempt_id: int) -> None:
    """``KILN_TEST_HOOKS={"hold_delivery_s": S}`` (tests only, see docs/workers.md): keep the message unacknowledged
    S seconds before the claim, the window in which a broker crash kills kombu's consumer."""
    raw = os.environ.get(ENV_TEST_HOOKS)
    hold = float(json.loads(raw).get("hold_delivery_s") or 0.0) if raw else 0.0
    if hold > 0:
        log.warning("TEST HOOK: holding the delivery of attempt %s for %.1f s before its claim", attempt_id, hold)
        time.sleep(hold)


@app.task(name=TASK_PROBE_CONSUMER, ignore_result=True)
def probe_consumer() -> None:
    """Run by the consumer: it consumes the host's queue (``workers.consumer_probe``)."""
    if CONSUMER_PROBE is not None:
        CONSUMER_PROBE.seen()
