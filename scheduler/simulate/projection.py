"""When and where a queued job would start: the same ``plan()`` run forward from a snapshot.

An event-driven projection: the running jobs end when one scenario says they do (``Ends``), the jobs ``plan()``
admits on the way run for the scenario's run time, and ``plan()`` decides again at every end (and every end of a
restart backoff), until the job is admitted, or the projection passes its horizon or its number of events. Each
step hands ``plan()`` what the live loop would hand it (the users' time limits, never the scenario's ends), so the
projection makes the decisions the scheduler would make, in the order it would make them.

What it does not know: jobs submitted later (a higher-priority arrival goes ahead), held jobs' release, hosts
joining or failing, dependencies' outcomes (a dependency that ends counts as succeeded). Fair-share usage and
budgets stay as they are at the snapshot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from core.gpu_types import matches
from core.policy_config import PolicyConfig
from core.states import JobState, Reason
from scheduler.policy.decisions import Admission, Decisions
from scheduler.policy.estimate import Estimator
from scheduler.policy.plan import plan
from scheduler.policy.snapshot import CPU, PendingJob, PlacedHost, RunningJob, Snapshot, quota_key_for

INF = math.inf
STOP_S = 60.0  # a preempted job's checkpoint and exit, before its units are free (the simulator's figure)
# The slowest pace the latest end allows a measured job: a job slower than 1.3x its own baseline breaks a silver
# step-time SLA (its default tolerance), so kiln does not plan on a slower one.
PACE_SLACK = 1.3
HORIZON_S = 14 * 86400.0  # beyond two weeks the queue will have changed past recognition
# plan() calls per scenario: one plan() over 300 pending and 100 running jobs on 320 GPUs takes ~10 ms on this
# project's 2-core box (docs/scheduler.md, "Expected start"); kiln why and the replay's measurement use the same.
MAX_EVENTS = 64


@dataclass(frozen=True, slots=True)
class Ends:
    """One scenario: each running job's end (POSIX s), and how long each pending job runs once started (INF:
    unknown, it holds its units past any horizon)."""

    running: Mapping[int, float]
    runtime: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class Start:
    at: float | None  # when plan() admits it; None: see ``stopped``
    hosts: tuple[str, ...] = ()
    # Why there is no start: "absent" (not a pending job of the snapshot: held, or no longer queued), "unknown"
    # (it waits on running jobs whose end is unknown: ``waits_on``), "drained" (everything ended and it still does
    # not start), "horizon", "events", "budget" (the bounds), "failed" (plan() fails it on the way: ``failed``).
    stopped: str | None = None
    waits_on: tuple[int, ...] = ()
    events: int = 0  # plan() calls after the first
    failed: str | None = None


@dataclass
class _World:
    snap: Snapshot
    ends: dict[int, float]  # running job -> its end in this scenario
    runtime: Mapping[int, float]
    requeue: dict[int, PendingJob]  # preempted, back in the queue once it has stopped
    requeue_runtime: dict[int, float]


def project(
    snapshot: Snapshot,
    config: PolicyConfig,
    job_id: int,
    ends: Ends,
    *,
    horizon_s: float,
    max_events: int,
    budget_s: float = INF,
) -> Start:
    """Run ``plan()`` forward until ``job_id`` is admitted (see the module's doc). ``budget_s``: seconds of this
    process's time it may take, for an interactive caller (a plan() over hundreds of jobs takes milliseconds)."""
    target = next((p for p in snapshot.pending if p.id == job_id), None)
    if target is None:
        return Start(None, stopped="absent")
    world = _World(snapshot, {r.id: ends.running.get(r.id, INF) for r in snapshot.running}, ends.runtime, {}, {})
    until = snapshot.now + horizon_s
    deadline = time.perf_counter() + budget_s
    for events in range(max_events + 1):
        decisions = plan(world.snap, config)
        mine = next((a for a in decisions.admissions if a.job_id == job_id), None)
        if mine is not None:
            return Start(world.snap.now, tuple(p.host for p in mine.placement), events=events)
        failed = next((f.message for f in decisions.failures if f.job_id == job_id), None)
        if failed is not None:
            return Start(None, stopped="failed", failed=failed, events=events)
        _apply(world, decisions)
        nxt = _next_event(world)
        if nxt == INF or nxt > until or time.perf_counter() > deadline:
            break
        _advance(world, nxt)
    if nxt == INF:  # nothing more ends: what still holds units for ever is what it waits on
        held = tuple(sorted(r.id for r in world.snap.running if world.ends.get(r.id) == INF and _holds(r, target)))
        return Start(None, stopped="unknown" if held else "drained", waits_on=held, events=events)
    bound = "horizon" if nxt > until else "events" if events == max_events else "budget"
    return Start(None, stopped=bound, events=events)


def _holds(r: RunningJob, job: PendingJob) -> bool:
    """Whether running job ``r`` holds units of the kind ``job`` needs (CPU slots, or GPUs of its type)."""
    if not job.gpus:
        return r.gpu_type == CPU
    return r.gpu_type != CPU and (job.gpu_type is None or matches(job.gpu_type, r.gpu_type))


def _apply(world: _World, d: Decisions) -> None:
    """The decisions as the live loop's ``apply`` would write them: admitted jobs run, killed and failed jobs go,
    preempted jobs stop (and come back to the queue), pending reasons are stored for the next cycle."""
    s = world.snap
    now = s.now
    gone = {k.job_id for k in d.time_limit_kills}
    running = [r for r in s.running if r.id not in gone]
    for jid in gone:
        world.ends.pop(jid, None)
    admitted = {a.job_id: a for a in d.admissions}
    dropped = {f.job_id for f in d.failures} | set(admitted)
    by_id = {p.id: p for p in s.pending} if admitted else {}
    model_of = {g.uuid: g.model for h in s.hosts for g in h.gpus} if admitted else {}
    teams = {t.id: t for t in s.teams} if admitted else {}
    for a in d.admissions:
        job = by_id[a.job_id]
        first = next((g for p in a.placement for g in p.gpus), None)
        model = CPU if not job.gpus else model_of.get(first, job.gpu_type or "") if first else job.gpu_type or ""
        key = quota_key_for(teams.get(job.team_id), job.gpus, job.gpu_type, model)
        running.append(_started(job, a, now, model, key))
        world.ends[job.id] = now + world.runtime.get(job.id, world.requeue_runtime.get(job.id, INF))
    victims = {p.job_id for p in d.preemptions}
    for i, r in enumerate(running):
        if r.id in victims and not r.preempt_requested:
            running[i] = replace(r, preempt_requested=True, state=JobState.PREEMPTING.value)
            left = world.ends.get(r.id, INF) - now
            world.ends[r.id] = now + STOP_S
            world.requeue[r.id] = _requeued(r, now)
            world.requeue_runtime[r.id] = left
    reasons = {w.job_id: str(w.reason) for w in d.pending}
    pending = tuple(
        replace(p, pending_reason=reasons.get(p.id, p.pending_reason)) for p in s.pending if p.id not in dropped
    )
    world.snap = replace(s, running=tuple(running), pending=pending)


def _next_event(world: _World) -> float:
    now = world.snap.now
    ends = [e for e in world.ends.values() if e > now]
    backoffs = [p.not_before for p in world.snap.pending if p.not_before is not None and p.not_before > now]
    return min([*ends, *backoffs], default=INF)


def _advance(world: _World, t: float) -> None:
    """Time moves to ``t``: the jobs that end by then are gone (a preempted one back in the queue)."""
    s = world.snap
    ended = {jid for jid, end in world.ends.items() if end <= t}
    for jid in ended:
        del world.ends[jid]
    back = tuple(world.requeue.pop(jid) for jid in sorted(ended) if jid in world.requeue)
    pending = tuple(_dependencies_met(p, ended) for p in s.pending) + back
    world.snap = replace(s, now=t, running=tuple(r for r in s.running if r.id not in ended), pending=pending)


def _dependencies_met(job: PendingJob, ended: set[int]) -> PendingJob:
    if not job.depends_on or not any(dep in ended for dep, _s, _c in job.depends_on):
        return job
    deps = tuple((dep, JobState.SUCCEEDED.value if dep in ended else st, c) for dep, st, c in job.depends_on)
    return replace(job, depends_on=deps)


def _started(job: PendingJob, a: Admission, now: float, model: str, quota_key: str) -> RunningJob:
    """What the loader would read of ``job`` once it runs under admission ``a``."""
    placement = tuple(PlacedHost(p.host, p.gpus, 0 if p.gpus else p.slots) for p in a.placement)
    limit = job.estimated_runtime_s
    return RunningJob(
        id=job.id,
        team_id=job.team_id,
        qos=job.qos,
        qos_priority=job.qos_priority,
        preemptible=job.preemptible,
        gpus=job.gpus or job.cpu_slots,
        gpu_type=model,
        quota_key=quota_key,
        placement=placement,
        started_at=now,
        bandwidth=job.bandwidth,
        expected_end=now + limit if limit is not None else None,  # as the loader reads it
        time_limit_s=limit,
        share=a.placement[0].share if a.placement else None,
        sweep_id=job.sweep_id,
        attained_s=job.attained_s,
    )


def _requeued(r: RunningJob, now: float) -> PendingJob:
    """A preempted job back in the queue, its service so far kept."""
    cpu = r.gpu_type == CPU
    return PendingJob(
        id=r.id,
        team_id=r.team_id,
        qos=r.qos,
        qos_priority=r.qos_priority,
        preemptible=r.preemptible,
        gpus=0 if cpu else r.gpus,
        cpu_slots=r.gpus if cpu else 1,
        submitted_at=r.started_at,
        gpu_type=None if cpu else r.gpu_type,
        quota_key=r.quota_key,
        estimated_runtime_s=r.time_limit_s,
        bandwidth=r.bandwidth,
        pending_reason=Reason.PREEMPTED.value,
        attained_s=r.attained_s + max(0.0, now - r.started_at),
        wait_started_at=now,
        share=r.share,
        sweep_id=r.sweep_id,
    )


def scenarios(snapshot: Snapshot, rates: dict[int, tuple[float, float]], grace_s: float) -> tuple[Ends, Ends]:
    """The earliest and the latest scenario of the running jobs' ends and the pending jobs' run times, from what the
    live system knows: ``rates`` (running job -> steps left, steps per second) where a job reports progress, else
    its time limit and its team's history (``Estimator``); never a job's true run time."""
    now = snapshot.now
    est = Estimator(snapshot.teams)
    early: dict[int, float] = {}
    late: dict[int, float] = {}
    for r in snapshot.running:
        attained = r.attained_s + max(0.0, now - r.started_at)
        limit_end = r.started_at + r.time_limit_s - r.attained_s + grace_s if r.time_limit_s is not None else INF
        if r.id in rates:
            left, rate = rates[r.id]
            early[r.id] = now + left / rate
            late[r.id] = max(early[r.id], min(limit_end, now + PACE_SLACK * left / rate))
        else:
            early[r.id] = now + est.remaining_s(r.team_id, r.time_limit_s, attained)
            late[r.id] = max(now, limit_end)
    run_early = {p.id: est.remaining_s(p.team_id, p.estimated_runtime_s, p.attained_s) for p in snapshot.pending}
    run_late = {
        p.id: p.estimated_runtime_s - p.attained_s + grace_s if p.estimated_runtime_s is not None else INF
        for p in snapshot.pending
    }
    return Ends(early, run_early), Ends(late, run_late)
