"""The SLA evaluator: measures each job against its contract every cycle and records violations as events.

Runs in the scheduler's cycle, after the decisions are applied, in the same transaction. A best-effort GPU share
has no step-time term (no speed is promised to it: MPS gives it what its neighbours leave). The step-time windows
(warm-up, baseline, recent: each a count of steps and a span of seconds) are ``core.repositories.step_times``'s.
Each violation is written once per job (per attempt for step time), so the timeline and the counters stay readable:

| event | when |
|---|---|
| ``SLA_QUEUE_WAIT_VIOLATION`` | a job's waits in the queue (the first, every requeue) pass ``max_queue_wait_s`` |
| ``SLA_DEADLINE_AT_RISK`` | a running job's projected finish (steps left x recent step time) is past its deadline |
| ``SLA_DEADLINE_VIOLATION`` | the deadline passed before the job succeeded |
| ``SLA_STEP_TIME_VIOLATION`` | recent median step time > ``step_time_tolerance`` x the attempt's own baseline |
| ``SLA_CHECKPOINT_RATE_VIOLATION`` | verified-checkpoint success rate < ``min_checkpoint_success_rate`` |
| ``SLA_BANDWIDTH_VIOLATION`` | NVML's PCIe/NVLink throughput of a running attempt's GPUs above its QoS quota |

A bandwidth violator whose class is preemptible is also preempted (checkpoint first, then back to the queue),
through ``Decisions`` like every preemption (``enforcement``, applied by the loop);
at launch the worker caps every job's NCCL channels in proportion to its quota, which is the throttle.

Recovery time against the objective is measured by the reconciler (``RECOVERED`` with ``met``); restarts past
``max_restarts`` fail the job there too. Attainment per team and QoS class is computed from these events
(``core.services.ops_metrics``), for ``/metrics`` and the dashboard alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from core.event_types import EventType
from core.models import Attempt, Event, Job, JobMetric, QosClass, SlaContract
from core.queue_wait import breached_at, queued_seconds, waits_for_capacity_sql
from core.repositories import jobs as jobs_repo
from core.repositories import step_times
from core.states import ACTIVE, JobState
from core.transitions import record_event
from scheduler.policy.decisions import Decisions, Preemption

QUEUE_WAIT = EventType.SLA_QUEUE_WAIT_VIOLATION
DEADLINE_AT_RISK = "SLA_DEADLINE_AT_RISK"
DEADLINE = EventType.SLA_DEADLINE_VIOLATION
STEP_TIME = step_times.VIOLATION
CHECKPOINT_RATE = EventType.SLA_CHECKPOINT_RATE_VIOLATION
BANDWIDTH = EventType.SLA_BANDWIDTH_VIOLATION
# Over quota means the median of the latest samples is this much above it: one burst is not a violation.
BANDWIDTH_SLACK = 1.10
BANDWIDTH_MIN_SAMPLES = 3
SAMPLE_ROWS = 8  # newest metric rows of a job searched for NVML samples
CHECKPOINT_FAILURES = (EventType.CHECKPOINT_FAILED, EventType.CHECKPOINT_CORRUPT)

# A job that finished recently can still have missed its deadline; older ones were evaluated already.
FINISHED_LOOKBACK = timedelta(hours=1)


@dataclass(frozen=True)
class Violation:
    job_id: int
    type: str
    message: str
    data: dict[str, object]


def evaluate(*, db: Session, now: datetime) -> list[Violation]:
    """Record new violations as events (no commit) and return them."""
    rows = _candidates(db, now)
    if not rows:
        return []
    already = _recorded(db, [job.id for job, _ in rows])
    contracts = {job.id: contract for job, contract in rows}
    running = [job for job, _ in rows if job.state == JobState.RUNNING.value]
    # Everything read per job is read for all of them at once: one query per kind, not one per job.
    pace = _deadline_pace(
        db,
        [
            job.id
            for job in running
            if contracts[job.id].deadline is not None and (job.id, DEADLINE_AT_RISK, None) not in already
        ],
    )
    found: list[Violation] = []
    for job, contract in rows:
        found += _queue_wait(job, contract, now, already)
        found += _deadline(job, contract, now, already, pace.get(job.id))
    found += _step_time(db, running, contracts, already)
    found += _checkpoint_rate(db, [job for job, _ in rows], contracts, already)
    found += _bandwidth(db, running, already)
    jobs = {job.id: job for job, _ in rows}
    for v in found:
        record_event(db, v.type, job=jobs[v.job_id], message=v.message, data=v.data, now=now)
    return found


def enforcement(violations: Iterable[Violation]) -> Decisions:
    """What the violations make the scheduler do, applied like the policy's own decisions: a preemptible bandwidth
    violator is preempted (checkpoint first, then back to the queue)."""
    return Decisions(
        preemptions=tuple(
            Preemption(v.job_id, reason=f"bandwidth quota: {v.message}")
            for v in violations
            if v.type == BANDWIDTH and v.data.get("action") == "preempt"
        )
    )


LIVE = frozenset(s.value for s in (JobState.QUEUED, JobState.LOST, *ACTIVE))


def _candidates(db: Session, now: datetime) -> Sequence[tuple[Job, SlaContract]]:
    """Jobs a term can still be measured on. The cycle runs this every time, so waiting jobs come only when their
    contract has a queue-wait or deadline term, and the spec (large JSON) is loaded only when a deadline asks. A job
    waiting as Unschedulable is left out: it can never start as the cluster is (``core.queue_wait``)."""
    waiting = [JobState.QUEUED.value, JobState.LOST.value]
    running = sorted(LIVE - set(waiting))
    stmt = (
        select(Job, SlaContract)
        .join(SlaContract, SlaContract.job_id == Job.id)
        .options(defer(Job.spec))
        .where(
            (Job.state.in_(running))
            | (
                Job.state.in_(waiting)
                & ~waits_for_capacity_sql()
                & (SlaContract.max_queue_wait_s.is_not(None) | SlaContract.deadline.is_not(None))
            )
            | ((Job.finished_at >= now - FINISHED_LOOKBACK) & SlaContract.deadline.is_not(None))
        )
    )
    return [(job, contract) for job, contract in db.execute(stmt).tuples()]


def _recorded(db: Session, job_ids: list[int]) -> set[tuple[int, str, int | None]]:
    """(job, type, attempt) of violations already written; attempt is None except for step time."""
    types = (QUEUE_WAIT, DEADLINE_AT_RISK, DEADLINE, STEP_TIME, CHECKPOINT_RATE, BANDWIDTH)
    out: set[tuple[int, str, int | None]] = set()
    for chunk in _chunks(job_ids, 1000):
        stmt = select(Event.job_id, Event.type, Event.data).where(Event.job_id.in_(chunk), Event.type.in_(types))
        for job_id, type_, data in db.execute(stmt).tuples():
            attempt = data.get("attempt_id") if type_ in (STEP_TIME, BANDWIDTH) else None
            out.add((int(job_id), type_, attempt))
    return out


def _queue_wait(
    job: Job, contract: SlaContract, now: datetime, already: set[tuple[int, str, int | None]]
) -> list[Violation]:
    limit = contract.max_queue_wait_s
    if limit is None or (job.id, QUEUE_WAIT, None) in already:
        return []
    # Every wait counts, the first and each requeue (core.queue_wait); never the time the job ran.
    waited = queued_seconds(job, now)
    if waited <= limit:
        return []
    data: dict[str, object] = {"kind": "queue_wait", "waited_s": round(waited, 3), "max_queue_wait_s": limit}
    # When the budget ran out, known while the job is still in the wait that broke it; otherwise it was admitted
    # since the last cycle (each cycle evaluates every waiting job), and the event's own time is within a cycle of
    # the breach. The SLA page reads it for a job admitted since.
    at = breached_at(job, limit)
    if at is not None:
        data["breached_at"] = at.isoformat()
    message = f"waited {waited:.0f}s in the queue (all waits), contract allows {limit:.0f}s"
    return [Violation(job.id, QUEUE_WAIT, message, data)]


def _deadline(
    job: Job,
    contract: SlaContract,
    now: datetime,
    already: set[tuple[int, str, int | None]],
    pace: tuple[float, int] | None,
) -> list[Violation]:
    """``pace``: the running job's recent median step time and its total steps (``_deadline_pace``)."""
    deadline = contract.deadline
    if deadline is None or (job.id, DEADLINE, None) in already:
        return []
    finished_late = job.state == JobState.SUCCEEDED.value and job.finished_at and job.finished_at > deadline
    # A job cancelled or failed by its owner's code is not the service missing a deadline.
    unfinished_past = job.state in LIVE and now > deadline
    if finished_late or unfinished_past:
        when = job.finished_at if finished_late else now
        assert when is not None
        late = (when - deadline).total_seconds()
        return [
            Violation(
                job.id,
                DEADLINE,
                f"deadline {deadline.isoformat()} missed by {late:.0f}s ({job.state})",
                {"kind": "deadline", "deadline": deadline.isoformat(), "late_s": round(late, 3)},
            )
        ]
    if job.state != JobState.RUNNING.value or (job.id, DEADLINE_AT_RISK, None) in already or pace is None:
        return []
    step_time, total_steps = pace
    if total_steps <= job.last_step:
        return []
    projected = now + timedelta(seconds=(total_steps - job.last_step) * step_time)
    if projected <= deadline:
        return []
    return [
        Violation(
            job.id,
            DEADLINE_AT_RISK,
            f"projected to finish at {projected.isoformat()}, after its deadline {deadline.isoformat()}",
            {"kind": "deadline_at_risk", "projected_finish": projected.isoformat(), "deadline": deadline.isoformat()},
        )
    ]


def _step_time(
    db: Session,
    running: list[Job],
    contracts: dict[int, SlaContract],
    already: set[tuple[int, str, int | None]],
) -> list[Violation]:
    # A best-effort GPU share runs on what its neighbours leave (MPS caps it, never reserves for it): no step time
    # is promised to it, so none is held against its own start (the H200's packing run: four shares, each slower
    # once the others began training, each "violated" against a baseline taken before they had).
    todo = {
        job_id: attempt_id
        for job_id, (attempt_id, placement) in _latest_attempts(db, [job.id for job in running]).items()
        if (job_id, STEP_TIME, attempt_id) not in already and not jobs_repo.is_best_effort_share(placement)
    }
    found: list[Violation] = []
    for job_id, w in step_times.windows(db, todo).items():
        v = step_times.violation(w, contracts[job_id].step_time_tolerance, todo[job_id])
        if v is not None:
            found.append(Violation(job_id, STEP_TIME, *v))
    return found


def _latest_attempts(db: Session, job_ids: list[int]) -> dict[int, tuple[int, list[Any]]]:
    """Each job's newest attempt (by number) and its placement."""
    latest: dict[int, tuple[int, int, list[Any]]] = {}
    for chunk in _chunks(job_ids, 1000):
        stmt = select(Attempt.job_id, Attempt.number, Attempt.id, Attempt.placement).where(Attempt.job_id.in_(chunk))
        for job_id, number, attempt_id, placement in db.execute(stmt).tuples():
            if job_id not in latest or number > latest[job_id][0]:
                latest[job_id] = (number, attempt_id, placement)
    return {job_id: (attempt_id, placement) for job_id, (_, attempt_id, placement) in latest.items()}


def _deadline_pace(db: Session, job_ids: list[int]) -> dict[int, tuple[float, int]]:
    """Per running job: the median of its last ``step_times.RECENT_STEPS`` step times and its spec's steps."""
    out: dict[int, tuple[float, int]] = {}
    for chunk in _chunks(job_ids, 1000):
        newest = (
            func.row_number()
            .over(partition_by=JobMetric.job_id, order_by=(JobMetric.step.desc(), JobMetric.id.desc()))
            .label("newest")
        )
        ranked = (
            select(JobMetric.job_id, JobMetric.step_time_s, newest)
            .where(JobMetric.job_id.in_(chunk), JobMetric.step_time_s.is_not(None))
            .subquery()
        )
        times: dict[int, list[float]] = {}
        last_few = select(ranked).where(ranked.c.newest <= step_times.RECENT_STEPS)
        for job_id, step_time, _ in db.execute(last_few).tuples():
            times.setdefault(job_id, []).append(step_time)
        steps = db.execute(select(Job.id, Job.spec["steps"].as_integer()).where(Job.id.in_(list(times))))
        for job_id, total in steps.tuples():
            out[job_id] = (statistics.median(times[job_id]), int(total or 0))
    return out


def _checkpoint_rate(
    db: Session, jobs: list[Job], contracts: dict[int, SlaContract], already: set[tuple[int, str, int | None]]
) -> list[Violation]:
    ids = [job.id for job in jobs if (job.id, CHECKPOINT_RATE, None) not in already]
    if not ids:
        return []
    counts: dict[int, list[int]] = {}  # job -> [verified, failed]
    for chunk in _chunks(ids, 1000):
        stmt = select(Event.job_id, Event.type).where(
            Event.job_id.in_(chunk), Event.type.in_((EventType.CHECKPOINT, *CHECKPOINT_FAILURES))
        )
        for job_id, type_ in db.execute(stmt).tuples():
            if job_id is None:
                continue
            pair = counts.setdefault(int(job_id), [0, 0])
            pair[0 if type_ == EventType.CHECKPOINT else 1] += 1
    found: list[Violation] = []
    for job_id, (ok, failed) in counts.items():
        minimum = contracts[job_id].min_checkpoint_success_rate
        if failed == 0 or ok + failed == 0:
            continue
        rate = ok / (ok + failed)
        if rate < minimum:
            found.append(
                Violation(
                    job_id,
                    CHECKPOINT_RATE,
                    f"checkpoint success rate {rate:.4f} ({ok} of {ok + failed}) is below {minimum:.4f}",
                    {"kind": "checkpoint_rate", "rate": rate, "minimum": minimum, "failed": failed},
                )
            )
    return found


def _bandwidth(db: Session, running: list[Job], already: set[tuple[int, str, int | None]]) -> list[Violation]:
    """Compare the NVML samples relayed for each running attempt with its QoS class's link quotas."""
    found: list[Violation] = []
    qos = {q.id: q for q in db.scalars(select(QosClass))}
    capped = {
        job.id: q
        for job in running
        if (q := qos.get(job.qos_class_id)) is not None
        and (q.pcie_bandwidth_bytes_per_s is not None or q.nvlink_bandwidth_bytes_per_s is not None)
    }
    for job_id, (attempt_id, samples) in _latest_gpu_samples(db, list(capped)).items():
        q = capped[job_id]
        if (job_id, BANDWIDTH, attempt_id) in already:
            continue
        for link, quota in (("pcie", q.pcie_bandwidth_bytes_per_s), ("nvlink", q.nvlink_bandwidth_bytes_per_s)):
            measured = _link_rate(samples, link)
            if quota is None or measured is None or measured <= quota * BANDWIDTH_SLACK:
                continue
            action = "preempt" if q.preemptible else "event"
            found.append(
                Violation(
                    job_id,
                    BANDWIDTH,
                    f"{link} {measured / 1e9:.1f} GB/s per GPU over the {q.name} quota {quota / 1e9:.1f} GB/s"
                    + (" (preempted: checkpoint, then requeue)" if action == "preempt" else ""),
                    {
                        "kind": "bandwidth",
                        "attempt_id": attempt_id,
                        "link": link,
                        "measured_bytes_per_s": measured,
                        "quota_bytes_per_s": quota,
                        "action": action,
                    },
                )
            )
            break  # one violation per attempt; the second link would say the same thing
    return found


def _latest_gpu_samples(db: Session, job_ids: list[int]) -> dict[int, tuple[int, list[dict[str, object]]]]:
    """Per job: the attempt and NVML samples of its newest metric row that has them, among its newest
    ``SAMPLE_ROWS`` (the relay attaches the latest samples to some rows only)."""
    out: dict[int, tuple[int, list[dict[str, object]]]] = {}
    for chunk in _chunks(job_ids, 1000):
        newest = func.row_number().over(partition_by=JobMetric.job_id, order_by=JobMetric.id.desc()).label("newest")
        ranked = (
            select(JobMetric.job_id, JobMetric.attempt_id, JobMetric.extra, newest)
            .where(JobMetric.job_id.in_(chunk), JobMetric.attempt_id.is_not(None))
            .subquery()
        )
        stmt = select(ranked).where(ranked.c.newest <= SAMPLE_ROWS).order_by(ranked.c.job_id, ranked.c.newest)
        for job_id, attempt_id, extra, _ in db.execute(stmt).tuples():
            gpu = (extra or {}).get("gpu")
            if job_id not in out and gpu:
                out[job_id] = (attempt_id, [s for s in gpu if isinstance(s, dict)])
    return out


def _link_rate(samples: list[dict[str, object]], link: str) -> float | None:
    """Median over the latest samples (one GPU each) of tx + rx on ``link``; None when NVML had no counter."""
    per_sample: list[float] = []
    for s in samples:
        tx, rx = s.get(f"{link}_tx_bytes_per_s"), s.get(f"{link}_rx_bytes_per_s")
        values = [float(v) for v in (tx, rx) if isinstance(v, (int, float))]
        if values:
            per_sample.append(sum(values))
    if len(per_sample) < BANDWIDTH_MIN_SAMPLES:
        return None
    return statistics.median(per_sample)


def _chunks(items: list[int], size: int) -> Iterable[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
