"""Relay the trainer's JSON-lines telemetry (``RUN_DIR/telemetry/rank{R}.jsonl``) into PostgreSQL.

The files are the trainer's only channel to the control plane (it never imports the database). The worker
tails them and, in the heartbeat transaction that also proves it still holds the fencing token, writes step
metrics, progress, checkpoints, events and the attempt's first-step time. A fenced worker relays nothing, so a
checkpoint committed by an attempt that lost the job never becomes a row.

The job's checkpoint rows describe the checkpoints its state comes from: a resume records the checkpoint it
resumed from (the attempt that committed it may have been cut off before relaying it) and forgets rows past it
(a checkpoint that failed verification or that the attempt rolled back over), and sets the job's step and loss
to that checkpoint's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.event_types import EventType
from core.forecast_errors import PEAK_MEMORY, TRAINER
from core.lifecycle import stop_cause
from core.models import Attempt, Checkpoint, Job, JobMetric
from core.private import read_regular
from core.repositories import checkpoints as checkpoints_repo
from core.services import forecasts
from core.sweeps import stopping as sweep_stopping
from core.trainer_protocol import TELEMETRY_DIR, RecordKind
from core.transitions import record_event

log = logging.getLogger(__name__)

# At most this many metric rows per relay (a heartbeat): a fast job (thousands of steps/s on small models)
# keeps an even sample of its curve, plus its newest step, without flooding the table.
MAX_METRICS_PER_FLUSH = 200


class TelemetryTail:
    """Reads whole new lines from every rank's file; a half-written last line waits for the next read."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir / TELEMETRY_DIR
        self._offsets: dict[Path, int] = {}

    def read_new(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        if not self.dir.is_dir():
            return records
        for path in sorted(self.dir.glob("rank*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                chunk = read_regular(path, offset)  # the rank's user wrote the directory: no link, no FIFO
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = offset + end + 1
            for line in chunk[: end + 1].splitlines():
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("unreadable telemetry line in %s: %r", path, line[:200])
                    continue
                if isinstance(rec, dict):
                    records.append(rec)
        records.sort(key=lambda r: float(r.get("ts") or 0.0))
        return records


def _ts(rec: dict[str, Any]) -> datetime:
    try:
        return datetime.fromtimestamp(float(rec["ts"]), UTC)
    except (KeyError, TypeError, ValueError):
        return datetime.now(UTC)


def _float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def downsample(steps: list[dict[str, Any]], limit: int = MAX_METRICS_PER_FLUSH) -> list[dict[str, Any]]:
    if len(steps) <= limit:
        return steps
    stride = -(-len(steps) // limit)
    kept = steps[::stride]
    if kept[-1] is not steps[-1]:
        kept.append(steps[-1])
    return kept


@dataclass
class RelayState:
    """What the relay remembers across heartbeats of one attempt."""

    first_step_seen: bool = False
    nccl_error: bool = False
    done: dict[str, Any] | None = None


def _as_asked(job: Job, type_: str, message: str, asked: str | None) -> tuple[str, str]:
    """The trainer calls every stop on SIGTERM a preemption (it cannot know why it was signalled); a stop that was
    not the scheduler's preemption is recorded as what it is, so a cancelled, held or timed-out job's timeline never
    says PREEMPTED. ``asked``: why the worker itself stopped the trainer (its time limit, a hang, its shutdown)."""
    cause = stop_cause(job)
    if cause is None and job.held_at is not None and job.preempt_requested:
        cause = job.pending_message or "held"  # "held by NAME: REASON" (core.transitions.hold)
    cause = cause or asked
    if cause is None:
        return type_, message
    if type_ == EventType.PREEMPTED:
        return EventType.STOPPING, f"{message} ({cause})"
    if type_ == EventType.EXIT:
        return type_, message.replace("(PREEMPTED)", f"(stopped: {cause})")
    return type_, message


@dataclass
class _Batch:
    """One relay's records being written: what each kind's handler reads, and the steps and GPU samples gathered
    for the metric rows written after them."""

    session: Session
    job: Job
    attempt: Attempt
    state: RelayState
    asked: str | None
    judge: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)


def _on_step(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    if rank == 0:
        b.steps.append(rec)


def _on_heartbeat(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    if rec.get("nccl_error"):
        b.state.nccl_error = True


def _on_event(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    fields = rec.get("fields") if isinstance(rec.get("fields"), dict) else {}
    type_, message = _as_asked(
        b.job, str(rec.get("type") or EventType.TRAINER_EVENT), str(rec.get("message") or ""), b.asked
    )
    record_event(
        b.session,
        type_[:48],
        job=b.job,
        message=message,
        data={"attempt": b.attempt.number, "rank": rank, **(fields or {})},
    )
    if rec.get("type") == EventType.ROLLED_BACK and rank == 0 and fields:
        _forget_checkpoints_after(b.session, job=b.job, step=_int(fields.get("to_step")) or 0)


def _on_checkpoint(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    _checkpoint(b.session, job=b.job, attempt=b.attempt, rec=rec)


def _on_resumed(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    step = _int(rec.get("step")) or 0
    if rank == 0:
        _resumed(b.session, job=b.job, attempt=b.attempt, rec=rec, step=step)


def _on_gpu_sample(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    b.gpu_samples.append(rec)


def _on_memory_prediction(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    if rank != 0:
        return
    job = b.job
    # The trainer's own figure, made on the device it runs on, replaces the one made at submit.
    job.predicted_memory_bytes = _int(rec.get("predicted_peak_bytes")) or job.predicted_memory_bytes
    record_event(
        b.session,
        EventType.MEMORY_PREDICTION,
        job=job,
        message=f"predicted peak memory {rec.get('predicted_peak_bytes')} bytes",
        data={k: v for k, v in rec.items() if k not in ("kind", "ts")},
    )
    _predicted_memory(b.session, job=job, rec=rec)


def _on_eval(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    if rank == 0:
        _evaluation(b.session, job=b.job, attempt=b.attempt, rec=rec, judge=b.judge)


def _on_done(b: _Batch, rec: dict[str, Any], rank: int) -> None:
    if rank == 0:
        b.state.done = rec


# What the relay does with each kind of record; a kind not here (a diagnostic, an unknown one) is not relayed.
_HANDLERS: dict[str, Callable[[_Batch, dict[str, Any], int], None]] = {
    RecordKind.STEP: _on_step,
    RecordKind.HEARTBEAT: _on_heartbeat,
    RecordKind.EVENT: _on_event,
    RecordKind.CHECKPOINT: _on_checkpoint,
    RecordKind.RESUMED: _on_resumed,
    RecordKind.GPU_SAMPLE: _on_gpu_sample,
    RecordKind.MEMORY_PREDICTION: _on_memory_prediction,
    RecordKind.EVAL: _on_eval,
    RecordKind.DONE: _on_done,
}


def relay(
    session: Session,
    *,
    job: Job,
    attempt: Attempt,
    records: list[dict[str, Any]],
    state: RelayState,
    asked: str | None = None,
    running: bool = True,
) -> None:
    """Write ``records`` for ``job``/``attempt``. The caller holds the job row and has checked the token.
    ``asked``: why the worker stopped the trainer, when it did so on its own account (``_as_asked``).
    ``running``: the trainer still runs (a heartbeat; False for the report after it exited), so a stop asked for
    now can still act: only then does its sweep's early stopping judge an evaluation."""
    judge = running and not any(rec.get("kind") == RecordKind.DONE for rec in records)  # not once it has finished
    batch = _Batch(session, job, attempt, state, asked, judge)
    for rec in records:
        kind = rec.get("kind")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None  # a JSON list or object is no kind
        if handler is not None:
            handler(batch, rec, _int(rec.get("rank")) or 0)
    if batch.steps:
        _write_steps(batch)
    elif batch.gpu_samples:
        session.add(
            JobMetric(
                job_id=job.id,
                attempt_id=attempt.id,
                step=job.last_step,
                ts=_ts(batch.gpu_samples[-1]),
                extra={"gpu": batch.gpu_samples[-8:]},
            )
        )


def _write_steps(b: _Batch) -> None:
    """The steps' progress on the job and the attempt, and an even sample of them as metric rows (the newest one
    carrying the latest GPU samples)."""
    job, attempt, steps = b.job, b.attempt, b.steps
    if attempt.first_step_at is None:
        # The first training step of this attempt: the end of a failover incident (recovery time).
        attempt.first_step_at = _ts(steps[0])
    b.state.first_step_seen = True
    last = steps[-1]
    job.last_step = _int(last.get("step")) or job.last_step
    loss = _float(last.get("loss"))
    if loss is not None:
        job.last_loss = loss
    kept = downsample(steps)
    for i, rec in enumerate(kept):
        # metrics: a script's named numbers of the step (trainer.script_client.report)
        extra: dict[str, Any] = {
            k: rec[k] for k in ("mem_allocated_bytes", "lr", "skipped", "metrics", "source") if k in rec
        }
        if i == len(kept) - 1 and b.gpu_samples:
            extra["gpu"] = b.gpu_samples[-8:]
        b.session.add(
            JobMetric(
                job_id=job.id,
                attempt_id=attempt.id,
                step=_int(rec.get("step")) or 0,
                ts=_ts(rec),
                loss=_float(rec.get("loss")),
                grad_norm=_float(rec.get("grad_norm")),
                tokens_per_s=_float(rec.get("tokens_per_s")),
                step_time_s=_float(rec.get("step_time_s")),
                mfu=_float(rec.get("mfu")),
                mem_peak_bytes=_int(rec.get("mem_peak_bytes")),
                overhead=str(rec["overhead"])[:32] if rec.get("overhead") else None,
                extra=extra,
            )
        )


def _predicted_memory(session: Session, *, job: Job, rec: dict[str, Any]) -> None:
    """The trainer's prediction, held to account against the job's measured peak (the first attempt's is kept)."""
    predicted = _int(rec.get("predicted_peak_bytes"))
    if predicted:
        forecasts.record_forecast(
            session,
            job=job,
            kind=PEAK_MEMORY,
            source=TRAINER,
            predicted=float(predicted),
            made_at=_ts(rec),
            note="predicted by the trainer on its device",
        )


def _evaluation(session: Session, *, job: Job, attempt: Attempt, rec: dict[str, Any], judge: bool) -> None:
    """The team code's evaluation: the job's latest metrics, an event on its timeline (CLI, dashboard), and, with
    ``judge``, its sweep's early-stopping rule applied to it (a job asked to stop hears it in the answer to this
    heartbeat)."""
    raw = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
    metrics = {str(k)[:64]: _float(v) for k, v in list((raw or {}).items())[:32]}
    step = _int(rec.get("step")) or 0
    job.eval_metrics = {"step": step, "metrics": metrics}
    shown = ", ".join(f"{k} {v:.4f}" if v is not None else f"{k} -" for k, v in metrics.items())
    record_event(
        session,
        EventType.EVALUATION,
        job=job,
        message=f"step {step}: {shown}"[:1000],
        data={"attempt": attempt.number, "step": step, "metrics": metrics},
    )
    if judge:
        sweep_stopping.stop_if_worse(session, job=job, step=step, metrics=metrics)


def _resumed(session: Session, *, job: Job, attempt: Attempt, rec: dict[str, Any], step: int) -> None:
    """The attempt continues from the checkpoint of ``step``: that is now the job's progress and its loss."""
    attempt.resumed_from_step = step
    job.last_step = step
    job.last_loss = _float(rec.get("loss"))
    _forget_checkpoints_after(session, job=job, step=step)
    if rec.get("tier", "durable") == "durable" and rec.get("sha256"):
        adopt_checkpoint(session, job=job, rec=rec, step=step)
    record_event(
        session,
        EventType.RESUMED,
        job=job,
        message=f"resumed from the checkpoint of step {step}",
        data={
            "attempt": attempt.number,
            "step": step,
            "path": rec.get("path"),
            "loss": rec.get("loss"),
            "checkpoint_token": rec.get("token"),
        },
    )


def adopt_checkpoint(session: Session, *, job: Job, rec: dict[str, Any], step: int) -> None:
    """The row of a verified durable checkpoint whose writer may never have relayed it (cut off, or its relay
    lost): ``rec`` carries its manifest's token, creation time, size and sha256; the writer is the attempt of that
    token."""
    token = _int(rec.get("token"))
    writer = session.scalars(select(Attempt.id).where(Attempt.job_id == job.id, Attempt.fencing_token == token)).first()
    row = {**rec, "verified": True, "ts": rec.get("created") or rec.get("ts")}  # when it was committed
    _upsert_checkpoint(session, job=job, attempt_id=writer, rec=row, step=step)


def _forget_checkpoints_after(session: Session, *, job: Job, step: int) -> None:
    """Rows past ``step`` describe no state the job has any more (it resumed or rolled back to ``step``)."""
    session.execute(delete(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step > step))


def _upsert_checkpoint(session: Session, *, job: Job, attempt_id: int | None, rec: dict[str, Any], step: int) -> None:
    checkpoints_repo.record(
        session,
        job_id=job.id,
        step=step,
        attempt_id=attempt_id,
        path=str(rec.get("path") or ""),
        size=_int(rec.get("bytes")) or 0,
        sha256=str(rec.get("sha256") or ""),
        verified=bool(rec.get("verified", False)),
        created_at=_ts(rec),
        keep_last=checkpoints_repo.keep_last(job.spec),
    )


def _checkpoint(session: Session, *, job: Job, attempt: Attempt, rec: dict[str, Any]) -> None:
    step = _int(rec.get("step"))
    if step is None:
        return
    _upsert_checkpoint(session, job=job, attempt_id=attempt.id, rec=rec, step=step)
    row_bytes = _int(rec.get("bytes")) or 0
    verified = bool(rec.get("verified", False))
    record_event(
        session,
        EventType.CHECKPOINT,
        job=job,
        message=f"checkpoint at step {step} ({row_bytes} bytes)",
        data={
            "attempt": attempt.number,
            "step": step,
            "bytes": row_bytes,
            "verified": verified,
            "loss": rec.get("loss"),
            "stall_s": rec.get("stall_s"),
            "write_s": rec.get("write_s"),
        },
    )
