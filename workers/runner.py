"""Supervise one node of an attempt from its trainer's launch to the final report: heartbeats that renew the
lease and relay telemetry, stops (cancel, preemption, time limit, hang, shutdown), and the outcome's report."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from core.db import session_scope, utcnow
from core.event_types import EventType
from core.fence import Lease, job_checkpoint_dir, lease_clock, write_lease
from core.lifecycle import ExitClass, end_attempt, end_attempt_as, renew_lease
from core.models import Attempt, Job, Usage
from core.models.jobs import spec_time_limit
from core.settings import Settings
from core.states import ACTIVE, AttemptState, JobState
from core.trainer_protocol import LEASE_FILE, RecordKind
from workers import mps
from workers.claimed import Claimed
from workers.exit_classes import Outcome, StopRequest, classify
from workers.final_state import FinalCheckpoint, judge
from workers.supervisor import TrainerProcess
from workers.telemetry_relay import RelayState, TelemetryTail, adopt_checkpoint, relay
from workers.worker_state import POLL_S, SHUTTING_DOWN

log = logging.getLogger(__name__)

EVAL_BEAT_S = 1.0  # an evaluation's own heartbeat comes no sooner than this after the last heartbeat


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
