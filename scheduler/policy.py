"""``plan(snapshot, config) -> Decisions``: the scheduling policy, pure and deterministic.

No database, no clock, no randomness: the same snapshot always yields the same decisions. The live loop and the
trace simulator both call this function. One pass over the pending jobs in policy order (see ``fairshare``);
for each job, in turn: dependencies, restart backoff, memory fit, GPU-hour budget, quota, then placement. A job
that cannot be placed may preempt (see ``preemption``), or take a reservation (the head of the queue and jobs at
risk of breaking their SLA); later jobs backfill only where they do not delay a reservation's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from scheduler.config import PolicyConfig
from scheduler.decisions import Admission, Decisions, Failure, Pending, PlacementEntry, Preemption, Reservation
from scheduler.fairshare import JobOrder
from scheduler.placement import INF, Chosen, ClusterState, Request
from scheduler.preemption import choose, eligible
from scheduler.quota import Key, QuotaLedger
from scheduler.reasons import Reason
from scheduler.snapshot import CPU, PendingJob, RunningJob, Snapshot

DEP_FAILED = frozenset({"FAILED", "CANCELLED"})


def _at(ts: float) -> str:
    """An absolute UTC time: messages stay identical from cycle to cycle, so they are not rewritten."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _fmt_s(seconds: float) -> str:
    if seconds == INF:
        return "unknown"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def placement_entries(state: ClusterState, chosen: Chosen, cpu: bool) -> tuple[PlacementEntry, ...]:
    return tuple(
        PlacementEntry(
            host=host,
            queue=state.queue_of(host),
            gpus=() if cpu else units,
            slots=len(units),
            node_rank=rank,
        )
        for rank, (host, units) in enumerate(chosen)
    )


class _Planner:
    def __init__(self, snapshot: Snapshot, config: PolicyConfig) -> None:
        self.s = snapshot
        self.c = config
        self.now = snapshot.now
        self.state = ClusterState(snapshot.hosts, snapshot.running, spread=config.placement == "spread")
        self.ledger = QuotaLedger(snapshot.teams, snapshot.running, enabled=config.enforce_quotas)
        self.teams = {t.id: t for t in snapshot.teams}
        self.kiln = config.ordering == "kiln"
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.pending: list[Pending] = []
        self.failures: list[Failure] = []
        self.reservations: list[Reservation] = []
        self.spent: dict[int, float] = {}  # GPU-hours admitted this cycle, per team
        self.inflight = [r for r in snapshot.running if r.preempt_requested]  # checkpointing before they stop
        self.claimed: set[int] = set()
        self.victimized: set[int] = set()
        self.preemptors = 0
        self.placement_failed = False
        self.preempt_attempts = 0
        self.no_victims: dict[tuple[object, ...], tuple[tuple[int, int, int], int]] = {}
        self.ends: list[tuple[float, int]] = [(self._end_of(r), r.id) for r in snapshot.running]

    def _end_of(self, r: RunningJob) -> float:
        if r.preempt_requested:
            return self.now
        return r.expected_end if r.expected_end is not None else INF

    def wait(self, job: PendingJob, reason: Reason, message: str) -> None:
        self.pending.append(Pending(job.id, reason, message))

    # -- the pass ------------------------------------------------------------------------------------------------

    def run(self) -> Decisions:
        kills = tuple(
            Failure(r.id, f"time limit of {_fmt_s(r.time_limit_s)} exceeded")
            for r in self.s.running
            if r.time_limit_s is not None
            and not r.preempt_requested
            and r.state == "RUNNING"
            and self.now - r.started_at > r.time_limit_s
        )
        order = JobOrder(self.s.pending, self.s.teams, self.now, self.c)
        fifo_blocker: int | None = None
        for job in order:
            if not self._eligible(job):
                continue
            if fifo_blocker is not None:
                self.wait(job, Reason.PRIORITY, f"behind job {fifo_blocker}, first in line (FIFO)")
                continue
            if not self.kiln or self.c.backfill or not self.reservations:
                if self._consider(job, order.urgent):
                    order.charge(job.team_id, job.demand)
                    continue
            else:
                holder = self.reservations[0].job_id
                self.wait(job, Reason.PRIORITY, f"behind job {holder}, which holds a reservation (no backfill)")
                continue
            if not self.kiln and self.placement_failed:
                fifo_blocker = job.id
        return Decisions(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            pending=tuple(self.pending),
            failures=tuple(self.failures),
            time_limit_kills=kills,
            reservations=tuple(self.reservations),
        )

    def _eligible(self, job: PendingJob) -> bool:
        failed = [d for d, st in job.depends_on if st in DEP_FAILED]
        if failed:
            self.failures.append(Failure(job.id, f"dependency {failed[0]} did not succeed"))
            return False
        waiting = [d for d, st in job.depends_on if st != "SUCCEEDED"]
        if waiting:
            self.wait(job, Reason.DEPENDENCY, "waiting for job(s) " + ", ".join(str(d) for d in waiting))
            return False
        if job.not_before is not None and job.not_before > self.now:
            self.wait(job, Reason.RESOURCES, f"restart backoff: eligible at {_at(job.not_before)}")
            return False
        return True

    def _request(self, job: PendingJob, end: float | None) -> Request:
        if job.gpus == 0:
            return Request(models=(CPU,), units=job.cpu_slots, bandwidth=job.bandwidth, end=end)
        models = (job.gpu_type,) if job.gpu_type else self.state.models
        return Request(
            models=models,
            units=job.gpus,
            per_node=job.gpus_per_node,
            min_memory=job.memory_bytes or 0,
            bandwidth=job.bandwidth,
            end=end,
        )

    def _consider(self, job: PendingJob, urgent: set[int]) -> bool:
        """Admit ``job`` or record why it waits (possibly preempting or reserving for it). True if admitted."""
        self.placement_failed = False
        est = job.estimated_runtime_s
        end = self.now + est if est is not None else None
        req = self._request(job, end)
        capacity = sum(self.state.total.get(m, 0) for m in req.models)
        if job.gpus and job.memory_bytes:
            if job.memory_cap_bytes is not None and job.memory_bytes > job.memory_cap_bytes:
                self.wait(
                    job,
                    Reason.MEMORY_FIT,
                    f"predicted {job.memory_bytes / 2**30:.1f} GiB per GPU exceeds the QoS cap of "
                    f"{job.memory_cap_bytes / 2**30:.1f} GiB",
                )
                return False
            largest = max((self.state.max_memory.get(m, 0) for m in req.models), default=0)
            if job.memory_bytes > largest:
                self.wait(
                    job,
                    Reason.MEMORY_FIT,
                    f"predicted {job.memory_bytes / 2**30:.1f} GiB per GPU; the largest eligible GPU has "
                    f"{largest / 2**30:.1f} GiB",
                )
                return False
        if capacity < job.demand:
            kind = "CPU slots" if job.gpus == 0 else f"{job.gpu_type or 'any'} GPUs"
            self.wait(job, Reason.RESOURCES, f"requests {job.demand} {kind}; the cluster has {capacity}")
            return False
        if self._over_budget(job):
            return False
        quota_msg = self.ledger.check(job.team_id, job.quota_key, job.demand)
        if quota_msg is None:
            chosen = self.state.find(req)
            if chosen is not None:
                self._admit(job, chosen, backfilled=bool(self.reservations))
                return True
            self.placement_failed = True
            if not self.kiln:
                self._classify(job, req, allow_priority=False)
                return False
        elif not (self.kiln and self.ledger.within_nominal(job.team_id, job.quota_key, job.demand)):
            self.wait(job, Reason.QUOTA, quota_msg)
            return False
        if self.c.preemption and self.preemptors < self.c.max_preemptors and self._preempt_for(job, req):
            return False
        if quota_msg is not None:
            self.wait(job, Reason.QUOTA, quota_msg)
            return False
        may_reserve = len(self.reservations) < self.c.max_reservations and (not self.reservations or job.id in urgent)
        if may_reserve and self._reserve(job, req):
            return False
        self._classify(job, req, allow_priority=True)
        return False

    def _over_budget(self, job: PendingJob) -> bool:
        team = self.teams.get(job.team_id)
        if not self.c.enforce_budgets or team is None or team.budget_gpu_hours is None:
            return False
        spent = team.used_gpu_hours + self.spent.get(job.team_id, 0.0)
        budget = team.budget_gpu_hours
        if spent >= budget:
            self.wait(job, Reason.BUDGET, f"team {team.name} used {spent:.1f} of {budget:.1f} GPU-hours this period")
            return True
        est = job.estimated_runtime_s
        if est is not None and spent + job.demand * est / 3600.0 > budget:
            self.wait(
                job,
                Reason.BUDGET,
                f"{job.demand * est / 3600.0:.1f} GPU-hours more would exceed team {team.name}'s budget "
                f"({spent:.1f} of {budget:.1f} used)",
            )
            return True
        return False

    def _admit(self, job: PendingJob, chosen: Chosen, *, backfilled: bool) -> None:
        self.state.allocate(job.id, chosen, job.bandwidth)
        self.ledger.charge(job.team_id, job.quota_key, job.demand)
        est = job.estimated_runtime_s
        if est is not None:
            self.spent[job.team_id] = self.spent.get(job.team_id, 0.0) + job.demand * est / 3600.0
        self.ends.append((self.now + est if est is not None else INF, job.id))
        self.admissions.append(Admission(job.id, placement_entries(self.state, chosen, job.gpus == 0), backfilled))

    def _classify(self, job: PendingJob, req: Request, *, allow_priority: bool) -> None:
        if allow_priority and self.state.reserved:
            ignoring = self.state.find(req, respect_reservations=False, pick=False)
            if ignoring is not None:
                holder = self.state.holder(ignoring)
                self.wait(job, Reason.PRIORITY, f"the free capacity it fits is held for job {holder}")
                return
        if req.bandwidth and self.state.find(req, respect_reservations=False, check_links=False, pick=False):
            links = ", ".join(f"{link} {bps / 1e9:.0f} GB/s" for link, bps in req.bandwidth)
            self.wait(job, Reason.BANDWIDTH_QUOTA, f"free GPUs exist, but no host link can carry {links}")
            return
        kind = "CPU slots" if req.models == (CPU,) else f"{'/'.join(req.models)} GPUs"
        where = f", {req.per_node} per node" if req.per_node else ""
        self.wait(job, Reason.RESOURCES, f"waiting for {req.units} free {kind}{where}")

    # -- preemption ----------------------------------------------------------------------------------------------

    def _preempt_for(self, job: PendingJob, req: Request) -> bool:
        # A search that found no victims stands, for as large a job of the same shape, until something changes.
        shape = (job.qos_priority, job.team_id, job.quota_key, req.models, req.per_node, req.min_memory, req.bandwidth)
        version = (self.state.version, self.ledger.version, len(self.victimized))
        failed = self.no_victims.get(shape)
        if failed is not None and failed[0] == version and req.units >= failed[1]:
            return False
        if self.preempt_attempts >= self.c.max_preempt_searches:
            return False
        self.preempt_attempts += 1
        found_victims = self._search_victims(job, req)
        if not found_victims:
            self.no_victims[shape] = (version, req.units)
        return found_victims

    def _search_victims(self, job: PendingJob, req: Request) -> bool:
        models = set(req.models)
        inflight = [
            r for r in self.inflight if r.id not in self.claimed and r.gpu_type in models
        ]
        within = self.ledger.within_nominal(job.team_id, job.quota_key, job.demand)

        def reclaim_from(v: RunningJob) -> bool:
            return (
                within
                and self.ledger.cohort(v.team_id) == self.ledger.cohort(job.team_id)
                and self.ledger.borrowed(v.team_id, v.quota_key) > 0
            )

        candidates = [
            r
            for r in self.s.running
            if r.id not in self.victimized
            and r.gpu_type in models
            and eligible(
                r,
                requester_priority=job.qos_priority,
                requester_team=job.team_id,
                quota_key=job.quota_key,
                reclaim_from=reclaim_from,
                now=self.now,
                min_run_time_s=self.c.min_run_time_s,
            )
        ]
        if not candidates and not inflight:
            return False
        found: dict[str, Chosen] = {}

        def fits(victims: Sequence[RunningJob]) -> bool:
            stopping = [*inflight, *victims]
            released: dict[Key, int] = {}
            units: set[str] = set()
            for v in stopping:
                key = (v.team_id, v.quota_key)
                released[key] = released.get(key, 0) + v.gpus
                units.update(self.state.job_units.get(v.id, ()))
            usable = sum(self.state.free_count.get(m, 0) for m in models) + len(units)
            if usable < req.units:
                return False
            if self.ledger.check(job.team_id, job.quota_key, job.demand, released) is not None:
                return False
            chosen = self.state.find(req, extra=frozenset(units))
            if chosen is None:
                return False
            found["chosen"] = chosen
            return True

        victims = choose(candidates, fits, now=self.now, limit=self.c.max_victim_candidates)
        if victims is None:
            return False
        fits(victims)  # the placement for the final set
        chosen = found["chosen"]
        units_chosen = {u for _h, us in chosen for u in us}
        for r in inflight:
            if units_chosen.intersection(self.state.job_units.get(r.id, ())):
                self.claimed.add(r.id)
        for v in victims:
            self.victimized.add(v.id)
            self.claimed.add(v.id)
            kind = "priority" if v.preemptible and v.qos_priority < job.qos_priority else "reclaim"
            why = (
                f"preempted for job {job.id} ({job.qos} outranks {v.qos})"
                if kind == "priority"
                else f"lent quota reclaimed by team {job.team_id} for job {job.id}"
            )
            self.preemptions.append(Preemption(v.id, why, job.id))
        self.preemptors += 1
        self.state.reserve(sorted(units_chosen), self.now, job.id)
        self.reservations.append(Reservation(job.id, None, tuple(sorted(units_chosen))))
        n_stop = len(victims) + sum(1 for r in inflight if r.id in self.claimed)
        self.wait(
            job,
            Reason.RESERVATION,
            f"capacity reserved: waiting for {n_stop} preempted job(s) to checkpoint and stop",
        )
        return True

    # -- reservations (backfill protection) ----------------------------------------------------------------------

    def _reserve(self, job: PendingJob, req: Request) -> bool:
        """Reserve the capacity on which ``job`` can start earliest, given running jobs' projected ends."""
        head = Request(req.models, req.units, req.per_node, req.min_memory, req.bandwidth, end=None)
        models = set(req.models)
        free = sum(self.state.free_count.get(m, 0) - self.state.reserved_free.get(m, 0) for m in models)
        extra: set[str] = set()
        chosen: Chosen | None = None
        start = INF
        for end, jid in sorted(self.ends):
            if jid in self.claimed:
                continue
            for u in self.state.job_units.get(jid, ()):
                if u not in self.state.reserved and self.state.model_of(u) in models:
                    extra.add(u)
            if free + len(extra) < req.units:
                continue
            chosen = self.state.find(head, extra=frozenset(extra))
            if chosen is not None:
                start = end
                break
        if chosen is None:
            return False
        units = sorted(u for _h, us in chosen for u in us)
        until = start if start != INF else self.now
        self.state.reserve(units, until, job.id)
        self.reservations.append(Reservation(job.id, None if start == INF else start, tuple(units)))
        when = "when running jobs end (no time limits known)" if start == INF else f"at {_at(start)}"
        self.wait(job, Reason.RESERVATION, f"capacity reserved for it; expected start {when}")
        return True


def plan(snapshot: Snapshot, config: PolicyConfig | None = None) -> Decisions:
    """Decide admissions, preemptions, pending reasons and failures for one scheduling cycle."""
    return _Planner(snapshot, config or PolicyConfig()).run()
