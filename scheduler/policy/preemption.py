"""Checkpoint-then-preempt: which running jobs to stop so that a pending job can start.

Three kinds of victim, never mixed up with "gold is never preempted by a lower class":

* *priority* victims: preemptible jobs of a strictly lower QoS class;
* *team* victims: the requester's own team's jobs of a strictly lower class, preemptible or not
  (``PolicyConfig.preempt_own_lower_classes``; Kueue's withinClusterQueue: LowerPriority);
* *reclaim* victims: jobs of another team of the cohort that is borrowing on the same quota key, of a class no
  higher than the requester's, taken only while the requester stays within its own nominal (Kueue's
  reclaimWithinCohort): borrowed capacity is lent at the borrower's risk.

Both respect a minimum run time. Candidates are ordered to lose the least work: GPU-seconds since the last
checkpoint, then lower class first, then the most recently started. The shortest prefix of that order that
fits (found by bisection: fitting is monotone in the set of victims) is pruned (last added first) while the
requester still fits; jobs already asked to checkpoint count as capacity first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.states import JobState
from scheduler.policy.snapshot import RunningJob


def lost_work(job: RunningJob, now: float) -> float:
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    return max(0.0, now - max(since, job.started_at)) * job.gpus


def cost(job: RunningJob, now: float, penalty_s: float = 0.0) -> float:
    """Victim order: lost work plus ``penalty_s`` GPU-seconds per GPU for each earlier preemption of the job."""
    return lost_work(job, now) + penalty_s * job.preemptions * job.gpus


def eligible(
    victim: RunningJob,
    *,
    requester_priority: int,
    requester_team: int,
    quota_key: str,
    reclaim_from: Callable[[RunningJob], bool],
    now: float,
    min_run_time_s: float,
    own_lower_classes: bool,
) -> bool:
    if victim.preempt_requested or victim.state != JobState.RUNNING:
        return False
    if now - victim.started_at < min_run_time_s:
        return False
    if victim.qos_priority < requester_priority and (
        victim.preemptible or (own_lower_classes and victim.team_id == requester_team)
    ):
        return True
    return (
        victim.team_id != requester_team
        and victim.quota_key == quota_key
        and victim.qos_priority <= requester_priority
        and reclaim_from(victim)
    )


def choose(
    candidates: Sequence[RunningJob],
    fits: Callable[[Sequence[RunningJob]], bool],
    *,
    now: float,
    limit: int,
    short: int | None = None,
    exact_trials: int = 8,
    penalty_s: float = 0.0,
) -> list[RunningJob] | None:
    """The victims (possibly none) after which ``fits`` holds, or None when no set of candidates suffices.

    With ``short`` (the GPUs the requester lacks), a single victim that fits exactly comes first: the smallest
    job of at least ``short`` GPUs whose release alone lets the requester fit (least lost work among equals), so
    one job stops instead of several smaller ones, and no freed GPUs are left stranded.
    """
    if fits(()):
        return []
    if short is not None:
        singles = sorted(
            (c for c in candidates if c.gpus >= short),
            key=lambda v: (v.gpus, cost(v, now, penalty_s), v.qos_priority, -v.started_at, v.id),
        )
        for v in singles[:exact_trials]:
            if fits((v,)):
                return [v]
    ordered = sorted(candidates, key=lambda v: (cost(v, now, penalty_s), v.qos_priority, -v.started_at, v.id))[:limit]
    # The greedy answer is the shortest prefix of ``ordered`` that fits. Stopping more jobs never makes the
    # requester fit less (more units, more hosts with enough of them, more quota released), so the shortest
    # prefix is found by bisection: log2(64) placement trials instead of one per candidate.
    if not ordered or not fits(ordered):
        return None
    lo, hi = 1, len(ordered)  # fits(ordered[:hi]) holds
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(ordered[:mid]):
            hi = mid
        else:
            lo = mid + 1
    chosen = list(ordered[:hi])
    # Prune, last added first (the last one is needed: the prefix without it did not fit).
    for v in reversed(chosen[:-1]):
        trial = [c for c in chosen if c is not v]
        if fits(trial):
            chosen = trial
    return chosen
