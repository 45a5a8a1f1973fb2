"""How often a job should checkpoint, from what kiln has measured: Young/Daly (``core.checkpoint_interval``) with the
job's own checkpoint cost and the failure rate kiln has seen on its GPU type; shown by ``kiln describe`` and
``GET /v1/jobs/{id}``.

* **Checkpoint cost** ``C``: the median over the job's newest checkpoints of how long a save held its training loop
  (``stall_s`` of the trainer's records; for a synchronous save, the whole write); failing that, the write's time;
  failing that, predicted from the checkpoint's size at 1 GB/s (the shared disk wrote 0.9-2.5 GB/s, README).
* **Failure rate**: infrastructure failures (LOST attempts; those of one host within 15 minutes are one incident)
  per host-hour that hosts of the GPU type were busy (the union of their attempts' usage), over 30 days. Below three
  failures the rate leans on a prior: one failure per 6,000 host-hours, Llama 3's (419 unexpected interruptions in
  54 days on 2,048 hosts of 8 H100s), as one pseudo-failure added to what kiln saw.
* A job on ``k`` hosts fails when any does: its MTBF is the host's over ``k``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from core.checkpoint_interval import daly_interval_s, expected_loss_s
from core.models import Attempt, Job
from core.repositories import failures as repo
from core.repositories import jobs as jobs_repo
from core.states import TERMINAL

WINDOW_S = 30 * 86400.0
MIN_FAILURES = 3
PRIOR_MTBF_H = 6000.0
INCIDENT_S = 900.0
PREDICTED_WRITE_BYTES_PER_S = 1e9
DEFAULT_RESTART_S = 60.0  # from a LOST to training again, before the job has restarted once


@dataclass(frozen=True)
class FailureRate:
    gpu_type: str
    failures: int
    host_hours: float
    mtbf_h: float
    from_prior: bool  # fewer than MIN_FAILURES seen: the prior weighs in


@dataclass(frozen=True)
class CheckpointAdvice:
    cost_s: float  # a checkpoint's cost to the job
    cost_measured: bool  # False: predicted from its size
    rate: FailureRate
    hosts: int
    advised_s: float  # seconds of training between checkpoints (Daly)
    chosen_s: float | None  # the job's own interval, where its step time is known
    every_steps: int | None
    step_s: float | None
    loss_gpu_h: float | None  # expected over the job's remaining steps, at its interval
    advised_loss_gpu_h: float | None  # the same at the advised one
    summary: str


def failure_rates(db: Session, now: datetime) -> dict[str, FailureRate]:
    """Per GPU type (``cpu`` for CPU hosts), the MTBF of a busy host (see the module's doc)."""
    since = now - timedelta(seconds=WINDOW_S)
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    type_of_host: dict[str, str] = {}
    type_of_attempt: dict[int, str] = {}
    for attempt_id, gpu_type, start, end, placement in repo.busy_since(db, since):
        type_of_attempt[attempt_id] = gpu_type
        lo, hi = max(start, since).timestamp(), min(end or now, now).timestamp()
        for node in placement:
            host = str(node.get("host")) if isinstance(node, dict) else ""
            type_of_host[host] = gpu_type
            if hi > lo:
                busy[host].append((lo, hi))
    hours: dict[str, float] = defaultdict(float)
    for host, spans in busy.items():
        hours[type_of_host[host]] += _union_s(spans) / 3600.0
    counts = _incidents(repo.lost_since(db, since), type_of_attempt, type_of_host)
    return {t: _rate(t, counts.get(t, 0), hours.get(t, 0.0)) for t in set(hours) | set(counts)}


def _union_s(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _incidents(lost: Any, type_of_attempt: dict[int, str], type_of_host: dict[str, str]) -> dict[str, int]:
    """LOST events per GPU type, one per incident: a LOST on a host that had one within INCIDENT_S is the same."""
    last: dict[str, float] = {}
    counts: dict[str, int] = defaultdict(int)
    for at, data in sorted(lost, key=lambda e: e[0]):
        hosts = [str(h) for h in data.get("hosts") or [] if h]
        t = at.timestamp()
        same = any(t - last.get(h, float("-inf")) < INCIDENT_S for h in hosts)
        for h in hosts:
            last[h] = t
        gpu_type = type_of_attempt.get(data.get("attempt_id") or -1) or next(
            (type_of_host[h] for h in hosts if h in type_of_host), None
        )
        if not same and gpu_type is not None:
            counts[gpu_type] += 1
    return counts


def _rate(gpu_type: str, failures: int, host_hours: float) -> FailureRate:
    if failures >= MIN_FAILURES:
        return FailureRate(gpu_type, failures, host_hours, host_hours / failures, False)
    return FailureRate(gpu_type, failures, host_hours, (host_hours + PRIOR_MTBF_H) / (failures + 1), True)


def advise(db: Session, job: Job, now: datetime) -> CheckpointAdvice | None:
    """The advice for a job not yet ended, once a checkpoint cost is known (None before its first checkpoint)."""
    if job.state in TERMINAL:
        return None
    cost = _cost(repo.checkpoint_events(db, job.id))
    if cost is None:
        return None
    attempt = _latest_attempt(db, job)
    rate = _rate_for(failure_rates(db, now), job)
    hosts = max(1, len(attempt.placement or [])) if attempt is not None else 1
    mtbf_s = rate.mtbf_h * 3600.0 / hosts
    cost_s, measured = cost
    advised = daly_interval_s(cost_s, mtbf_s)
    step_s = _step_s(job, attempt, now)
    ckpt = (job.spec or {}).get("checkpointing") or {}
    every_steps = ckpt.get("every_steps") if ckpt.get("every_seconds") is None else None
    chosen = float(ckpt["every_seconds"]) if ckpt.get("every_seconds") else None
    if chosen is None and every_steps and step_s:
        chosen = every_steps * step_s
    loss = advised_loss = None
    if step_s and chosen:
        work = max(0, int((job.spec or {}).get("steps") or 0) - job.last_step) * step_s
        units = (job.gpus or 1) / 3600.0
        restart = _restart_s(attempt)
        loss = expected_loss_s(work, chosen, cost_s, restart, mtbf_s) * units
        advised_loss = expected_loss_s(work, advised, cost_s, restart, mtbf_s) * units
    advice = CheckpointAdvice(
        cost_s, measured, rate, hosts, advised, chosen, every_steps, step_s, loss, advised_loss, ""
    )
    return replace(advice, summary=summary(advice))


def summary(a: CheckpointAdvice) -> str:
    """One line: 'checkpoint every 200 steps (~6 min); advised ~11 min (Young/Daly: save 4.1 s, MTBF 38 h on H200
    from 3 failures in 114 host-hours); expected loss 0.9 vs 0.6 GPU-h'."""
    chosen = f"every {a.every_steps} steps" if a.every_steps else "its interval"
    if a.chosen_s is not None:
        chosen += f" (~{_dur(a.chosen_s)})"
    advised = f"~{_dur(a.advised_s)}"
    if a.step_s:
        advised += f" (~{max(1, round(a.advised_s / a.step_s))} steps)"
    r = a.rate
    seen = f"from {r.failures} failure(s) in {r.host_hours:.0f} host-hours"
    if r.from_prior:
        seen += f" and a prior of 1 in {PRIOR_MTBF_H:.0f}"
    save = f"save {a.cost_s:.1f} s" + ("" if a.cost_measured else " predicted from its size")
    per_job = f" over {a.hosts} hosts" if a.hosts > 1 else ""
    line = (
        f"checkpoint {chosen}; advised {advised} (Young/Daly: {save}, MTBF {r.mtbf_h:.0f} h{per_job} on "
        f"{r.gpu_type} {seen})"
    )
    if a.loss_gpu_h is not None and a.advised_loss_gpu_h is not None:
        digits = 2 if a.loss_gpu_h < 10 else 1
        line += f"; expected loss {a.loss_gpu_h:.{digits}f} vs {a.advised_loss_gpu_h:.{digits}f} GPU-h"
    return line


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _cost(events: Any) -> tuple[float, bool] | None:
    """(seconds, measured) from the newest checkpoint events' data (see the module's doc)."""
    for key in ("stall_s", "write_s", "duration_s"):
        values = [float(d[key]) for d in events if isinstance(d.get(key), (int, float))]
        if values:
            return statistics.median(values), True
    sizes = [float(d["bytes"]) for d in events if isinstance(d.get("bytes"), (int, float)) and d["bytes"] > 0]
    return (statistics.median(sizes) / PREDICTED_WRITE_BYTES_PER_S, False) if sizes else None


def _latest_attempt(db: Session, job: Job) -> Attempt | None:
    number = jobs_repo.latest_attempt_number(db, job.id)
    return next((a for a in job.attempts if a.number == number), None) if number is not None else None


def _rate_for(rates: dict[str, FailureRate], job: Job) -> FailureRate:
    """The job's GPU type's; a job that names none: every GPU type's together."""
    if not job.gpus or job.gpu_type:
        key = job.gpu_type if job.gpus and job.gpu_type else "cpu"
        return rates.get(key) or _rate(key, 0, 0.0)
    gpu = [r for t, r in rates.items() if t != "cpu"]
    return _rate("any GPU", sum(r.failures for r in gpu), sum(r.host_hours for r in gpu))


def _step_s(job: Job, attempt: Attempt | None, now: datetime) -> float | None:
    """Seconds a step, measured over the latest attempt."""
    if attempt is None or attempt.first_step_at is None:
        return None
    done = job.last_step - (attempt.resumed_from_step or 0)
    seen = ((attempt.ended_at or attempt.heartbeat_at or now) - attempt.first_step_at).total_seconds()
    return seen / done if done > 0 and seen > 0 else None


def _restart_s(attempt: Attempt | None) -> float:
    """From a resumed attempt's start to its first step: what a restart costs before training again (a first
    attempt's start-up is not a restart: nothing to restore, a cold compile)."""
    if attempt is None or attempt.resumed_from_step is None or attempt.first_step_at is None or not attempt.started_at:
        return DEFAULT_RESTART_S
    return max(0.0, (attempt.first_step_at - attempt.started_at).total_seconds())
