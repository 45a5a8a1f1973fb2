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

``Preemptor`` runs the search for the planner (Kueue's preemptor beside its scheduler): it finds and claims the
victims; the planner records the preemptions and reserves the capacity they free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.policy_config import PolicyConfig
from core.states import JobState
from scheduler.policy.decisions import Preemption
from scheduler.policy.placement import Chosen, ClusterState, Request
from scheduler.policy.quota import Key, QuotaLedger
from scheduler.policy.snapshot import PendingJob, RunningJob, Snapshot


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


@dataclass(frozen=True)
class Targets:
    """What one requester's preemption takes: the jobs asked to stop, the units reserved for it once they (and the
    stops already in flight that it needs) have stopped, and how many jobs it waits for."""

    preemptions: tuple[Preemption, ...]
    units: tuple[str, ...]
    stopping: int


def victim_reason(victim: RunningJob, requester: PendingJob) -> str:
    """Why ``victim`` is stopped for ``requester``: a lower class (its own team's too), or lent quota reclaimed."""
    if victim.qos_priority < requester.qos_priority and (victim.preemptible or victim.team_id == requester.team_id):
        own = "" if victim.preemptible else " of its own team"
        return f"preempted for job {requester.id}{own} ({requester.qos} outranks {victim.qos})"
    return f"lent quota reclaimed by team {requester.team_id} for job {requester.id}"


class _Fit:
    """Whether the requester fits once ``victims`` and the stops in flight have released their units and quota;
    remembers the placement of the last set that fitted."""

    def __init__(
        self, job: PendingJob, req: Request, *, state: ClusterState, ledger: QuotaLedger, inflight: list[RunningJob]
    ) -> None:
        self.job = job
        self.req = req
        self.state = state
        self.ledger = ledger
        self.inflight = inflight
        self.models = set(req.models)
        self.chosen: Chosen | None = None

    def __call__(self, victims: Sequence[RunningJob]) -> bool:
        released: dict[Key, int] = {}
        units: set[str] = set()
        for v in [*self.inflight, *victims]:
            key = (v.team_id, v.quota_key)
            released[key] = released.get(key, 0) + v.gpus
            units.update(self.state.job_units.get(v.id, ()))
        usable = sum(self.state.free_count.get(m, 0) for m in self.models) + len(units)
        if usable < self.req.units:
            return False
        job = self.job
        if self.ledger.check(job.team_id, job.quota_key, job.demand, released) is not None:
            return False
        chosen = self.state.find(self.req, extra=frozenset(units))
        if chosen is None:
            return False
        self.chosen = chosen
        return True


class Preemptor:
    """One cycle's victim search (the planner applies what it finds): the jobs this cycle's requesters may stop,
    and what it has taken already (victims, stops in flight claimed) and which searches found nothing."""

    def __init__(self, snapshot: Snapshot, config: PolicyConfig, state: ClusterState, ledger: QuotaLedger) -> None:
        self.s = snapshot
        self.c = config
        self.now = snapshot.now
        self.state = state
        self.ledger = ledger
        self.inflight = [r for r in snapshot.running if r.preempt_requested]  # checkpointing before they stop
        self.claimed: set[int] = set()  # victims and stops in flight whose units a requester of this cycle takes
        self.victimized: set[int] = set()
        self.searches = 0
        self.no_victims: dict[tuple[object, ...], tuple[tuple[int, int, int], int]] = {}
        self.promised_ids: set[int] = set()  # running jobs whose units are reserved, as of ``promised_version``
        self.promised_version = 0
        # running jobs that some requester may stop (RUNNING, whole GPUs, past the minimum run time), found once
        self.stoppable: list[RunningJob] | None = None

    def targets(
        self, job: PendingJob, req: Request, *, reservations: int, should_preempt: Callable[[], bool]
    ) -> Targets | None:
        """The jobs to stop for ``job`` (taken: no later requester of the cycle gets them), or None.
        ``reservations``: how many the planner holds (the units they promise are not ours to take);
        ``should_preempt``: whether waiting would start ``job`` too late, asked only once there are victims."""
        # A search that found no victims stands, for as large a job of the same shape, until something changes.
        shape = (job.qos_priority, job.team_id, job.quota_key, req.models, req.per_node, req.min_memory, req.bandwidth)
        version = (self.state.version, self.ledger.version, len(self.victimized))
        failed = self.no_victims.get(shape)
        if failed is not None and failed[0] == version and req.units >= failed[1]:
            return None
        if self.searches >= self.c.max_preempt_searches:
            return None
        found = self._search(job, req, reservations, should_preempt)
        if found is None:
            self.no_victims[shape] = (version, req.units)
        return found

    def _promised(self, reservations: int) -> set[int]:
        """Running jobs whose units are reserved for a job ahead: not ours to take."""
        if self.promised_version != reservations:
            reserved = self.state.reserved
            self.promised_ids = {
                jid for jid, units in self.state.job_units.items() if any(u in reserved for u in units)
            }
            self.promised_version = reservations
        return self.promised_ids

    def _candidates(self, job: PendingJob, models: set[str], promised: set[int]) -> list[RunningJob]:
        within = self.ledger.within_nominal(job.team_id, job.quota_key, job.demand)

        def reclaim_from(v: RunningJob) -> bool:
            return (
                within
                and self.ledger.cohort(v.team_id) == self.ledger.cohort(job.team_id)
                and self.ledger.borrowed(v.team_id, v.quota_key) > 0
            )

        capped = self.c.max_preemptions_per_job
        top = self.c.uncapped_preemptor_priority
        if top is not None and job.qos_priority >= top:
            capped = None
        if self.stoppable is None:  # once a cycle: what no requester could take is never looked at again
            self.stoppable = [
                r
                for r in self.s.running
                if r.share is None
                and not r.preempt_requested
                and r.state == JobState.RUNNING
                and self.now - r.started_at >= self.c.min_run_time_s
            ]
        return [
            r
            for r in self.stoppable
            if r.id not in self.victimized
            and r.share is None  # a fractional job's end frees no whole GPU
            and r.gpu_type in models
            and r.id not in promised
            and (capped is None or r.preemptions < capped)
            and eligible(
                r,
                requester_priority=job.qos_priority,
                requester_team=job.team_id,
                quota_key=job.quota_key,
                reclaim_from=reclaim_from,
                now=self.now,
                min_run_time_s=self.c.min_run_time_s,
                own_lower_classes=self.c.preempt_own_lower_classes,
            )
        ]

    def _search(
        self, job: PendingJob, req: Request, reservations: int, should_preempt: Callable[[], bool]
    ) -> Targets | None:
        models = set(req.models)
        promised = self._promised(reservations)
        inflight = [
            r
            for r in self.inflight
            if r.id not in self.claimed and r.share is None and r.gpu_type in models and r.id not in promised
        ]
        candidates = self._candidates(job, models, promised)
        if not candidates and not inflight:
            return None
        # Only now, with victims to take, ask whether waiting would be too late (the projection costs placements).
        if not should_preempt():
            return None
        self.searches += 1
        fit = _Fit(job, req, state=self.state, ledger=self.ledger, inflight=inflight)
        free_now = sum(self.state.free_count.get(m, 0) for m in models) + sum(r.gpus for r in inflight)
        victims = choose(
            candidates,
            fit,
            now=self.now,
            limit=self.c.max_victim_candidates,
            short=max(1, req.units - free_now),
            penalty_s=self.c.victim_preempted_penalty_s,
        )
        if victims is None:
            return None
        fit(victims)  # the placement for the final set
        assert fit.chosen is not None
        return self._take(job, victims, inflight, fit.chosen)

    def _take(self, job: PendingJob, victims: list[RunningJob], inflight: list[RunningJob], chosen: Chosen) -> Targets:
        """Claim the victims and the stops in flight whose units the placement uses."""
        units = {u for _h, us in chosen for u in us}
        for r in inflight:
            if units.intersection(self.state.job_units.get(r.id, ())):
                self.claimed.add(r.id)
        for v in victims:
            self.victimized.add(v.id)
            self.claimed.add(v.id)
        preemptions = tuple(Preemption(v.id, victim_reason(v, job), job.id) for v in victims)
        stopping = len(victims) + sum(1 for r in inflight if r.id in self.claimed)
        return Targets(preemptions, tuple(sorted(units)), stopping)
