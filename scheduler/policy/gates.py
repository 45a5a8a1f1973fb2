"""The checks a pending job passes before the planner looks for room for it (its sweep's limit, its dependencies
and restart backoff, its memory fit, its team's GPU-hour budget), and the running jobs past their time limit."""

from __future__ import annotations

from datetime import UTC, datetime

from core.states import JobState, Reason
from scheduler.policy.decisions import Failure, Pending
from scheduler.policy.placement import INF
from scheduler.policy.snapshot import PendingJob, RunningJob, TeamInfo

DEP_FAILED = frozenset({JobState.FAILED, JobState.CANCELLED})
DEP_ENDED = DEP_FAILED | {JobState.SUCCEEDED}


def never_met(dep: int, state: str, condition: str) -> str | None:
    """Why a dependency can no longer be met (the job then fails), or None. Conditions as Slurm names them:
    afterok (the other job succeeded), afterany (it ended, however), afternotok (it failed or was cancelled)."""
    if condition == "afterok" and state in DEP_FAILED:
        return f"dependency {dep} did not succeed"
    if condition == "afternotok" and state == JobState.SUCCEEDED:
        return f"dependency {dep} succeeded; this job was to run only if it failed (afternotok)"
    return None


def at(ts: float) -> str:
    """An absolute UTC time: messages stay identical from cycle to cycle, so they are not rewritten."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_s(seconds: float) -> str:
    if seconds == INF:
        return "unknown"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def time_limit_kills(running: tuple[RunningJob, ...], now: float, grace_s: float) -> tuple[Failure, ...]:
    """The backstop behind the worker, which stops a job at its limit itself: the limit counts every attempt's run
    (``attained_s``, the earlier ones), as the worker counts it."""
    return tuple(
        Failure(r.id, f"time limit of {fmt_s(r.time_limit_s)} exceeded")
        for r in running
        if r.time_limit_s is not None
        and not r.preempt_requested
        and r.state == JobState.RUNNING
        and r.attained_s + now - r.started_at > r.time_limit_s + grace_s
    )


def not_yet(job: PendingJob, *, sweep_running: int, now: float) -> Pending | Failure | None:
    """Why ``job`` is not considered this cycle (its sweep runs its most jobs at once, it waits for a dependency
    or out a restart backoff), or its failure (a dependency that can no longer be met); None when it is."""
    if job.sweep_id is not None and job.sweep_limit is not None and sweep_running >= job.sweep_limit:
        return Pending(
            job.id,
            Reason.SWEEP_LIMIT,
            f"sweep {job.sweep_id} runs {sweep_running} of its jobs at once (max_concurrent {job.sweep_limit})",
        )
    if not job.depends_on and job.not_before is None:
        return None
    waiting: list[int] = []
    for dep, state, condition in job.depends_on:
        never = never_met(dep, state, condition)
        if never is not None:
            return Failure(job.id, never)
        if state not in DEP_ENDED or (condition == "afterok" and state != JobState.SUCCEEDED):
            waiting.append(dep)
    if waiting:
        return Pending(job.id, Reason.DEPENDENCY, "waiting for job(s) " + ", ".join(str(d) for d in waiting))
    if job.not_before is not None and job.not_before > now:
        return Pending(job.id, Reason.RESOURCES, f"restart backoff: eligible at {at(job.not_before)}")
    return None


def memory_misfit(job: PendingJob, largest: int) -> str | None:
    """Why the job's predicted memory per GPU fits neither its QoS cap nor the ``largest`` eligible GPU, or None.
    No eligible GPU at all (``largest`` 0: a CPU-only cluster, a type not there) is the capacity's reason."""
    if not job.memory_bytes:
        return None
    if job.memory_cap_bytes is not None and job.memory_bytes > job.memory_cap_bytes:
        return (
            f"predicted {job.memory_bytes / 2**30:.1f} GiB per GPU exceeds the QoS cap of "
            f"{job.memory_cap_bytes / 2**30:.1f} GiB"
        )
    if largest and job.memory_bytes > largest:
        return (
            f"predicted {job.memory_bytes / 2**30:.1f} GiB per GPU; the largest eligible GPU has "
            f"{largest / 2**30:.1f} GiB"
        )
    return None


def over_budget(job: PendingJob, team: TeamInfo | None, spent_this_cycle: float) -> str | None:
    """Why the job would take its team past its GPU-hour budget (used this period and admitted this cycle), or
    None (no budget, or within it)."""
    if team is None or team.budget_gpu_hours is None:
        return None
    spent = team.used_gpu_hours + spent_this_cycle
    budget = team.budget_gpu_hours
    if spent >= budget:
        return f"team {team.name} used {spent:.1f} of {budget:.1f} GPU-hours this period"
    est = job.estimated_runtime_s
    if est is not None and spent + job.demand * est / 3600.0 > budget:
        return (
            f"{job.demand * est / 3600.0:.1f} GPU-hours more would exceed team {team.name}'s budget "
            f"({spent:.1f} of {budget:.1f} used)"
        )
    return None
