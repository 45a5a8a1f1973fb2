"""The order in which pending jobs are considered.

``kiln``: QoS classes in tiers, highest first (``class_order``: by default each non-preemptible class is a tier of
its own and the preemptible classes share one; ``strict``: every class its own tier; ``service``: one tier).
Within a tier, every class's jobs at risk of breaking their SLA come first, earliest
breach first (queue-wait SLA once a job has waited ``sla_reserve_fraction`` of its max wait; a deadline once the
projected finish leaves less than ``deadline_slack_s``; a job without a queue-wait SLA once it has waited
``starvation_age_s``: aging, oldest first); ahead of those, jobs that held a reservation in the previous cycle
(stored reason ``Reservation``: their capacity, possibly freed by preemption for them, is not handed to
another). The rest are merged across teams by fair share: the team with the least usage per unit of weight goes
next, where usage is the decayed GPU-seconds of the snapshot plus what this cycle has admitted so far (so one
team's long queue does not take a whole cycle); within a team, by user priority, then submission time.

Within a tier and after the jobs at risk, ``kiln`` orders by discretised expected remaining service
(``scheduler.policy.estimate``: GPUs x the run time still expected from the user's time limit, the attained service and
the team's history; Tiresias' least-attained-service queues with the estimates kiln really has), then by QoS class,
then by fair share and age within one service class and class. In the first tier with a preemptible class, right
after its jobs at risk, go the jobs overdue by the backlog bound (``backlog_bound``: queued longer than the cluster
needs to drain all the work it knows of, or twice that for a job whose time limit ends sooner; the most time-limit
left first) and then the makespan guard's (off by default); both may
reserve but never preempt.

``priority`` (the Slurm multifactor / Kueue baseline): QoS class, then fair share, then age; no SLA urgency.
``fifo``: submission time, then id. ``sjf``: shortest ``estimated_runtime_s`` first (with the true run time as the
estimate, the simulator's oracle bound).
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Iterator, Sequence

from core.policy_config import PolicyConfig
from core.states import Reason
from scheduler.policy.estimate import DEFAULT_LIMIT_USE, MIN_REMAINING_S, Estimator
from scheduler.policy.snapshot import PendingJob, TeamInfo


def urgency(job: PendingJob, now: float, config: PolicyConfig) -> float | None:
    """Seconds until the job's SLA breaks, when it is at risk; None otherwise."""
    best: float | None = None
    if not config.sla_urgency:
        return None
    due = job.queue_wait_due
    wait = job.max_queue_wait_s
    at_risk = due is not None and wait is not None and due - now <= (1 - config.sla_reserve_fraction) * wait
    if at_risk and due is not None and (config.urgent_after_breach or due > now):
        best = due - now  # a job whose SLA is already broken is not urgent (triage): it has nothing left to save
    if best is None and job.max_queue_wait_s is None and config.starvation_age_s is not None:
        waited = now - job.submitted_at
        if waited >= config.starvation_age_s:
            best = job.submitted_at + 2 * config.starvation_age_s - now  # oldest first, after real breaches
    if job.deadline is not None:
        slack = job.deadline - now - (job.estimated_runtime_s or 0.0)
        if slack < config.deadline_slack_s:
            best = slack if best is None else min(best, slack)
    return best


_SUBMITTED = operator.attrgetter("submitted_at", "id")
_PRIORITY = operator.attrgetter("priority")


class JobOrder:
    """Iterates pending jobs in policy order; ``charge`` tells it what an admission cost its team.

    The order is computed in one generator (no nested ones: a cycle walks ten thousand jobs and every level of
    delegation costs each of them), with the urgency and the service class of each job inlined: the same
    arithmetic as ``urgency``, ``Estimator.remaining_s`` and ``service_class``, which stay the reference.
    """

    def __init__(
        self,
        jobs: Sequence[PendingJob],
        teams: Sequence[TeamInfo],
        now: float,
        config: PolicyConfig,
        *,
        running_gpu_s: float = 0.0,
        capacity: int = 0,
    ) -> None:
        self.config = config
        # running jobs' GPU-seconds until their projected ends, and the cluster's GPUs (makespan guard, backlog bound)
        self.running_gpu_s = running_gpu_s
        self.capacity = capacity
        self._drain: float | None = None  # seconds to finish the known work (``_drain_s``), once a cycle
        self.now = now
        self.jobs = jobs
        self.usage = {t.id: t.decayed_usage for t in teams}
        self.weight = {t.id: t.weight for t in teams}
        self.urgent: set[int] = set()
        self.aged: set[int] = set()  # the oldest job of a class, long waiting: first after the at-risk, no preemption
        self.estimator = Estimator(teams) if config.ordering == "kiln" and config.service_classes else None
        self.charges = 0  # admissions charged so far: a team keeps its turn in the fair merge until the next one

    def score(self, team_id: int) -> float:
        return self.usage.get(team_id, 0.0) / max(self.weight.get(team_id, 1.0), 1e-9)

    def charge(self, team_id: int, units: int) -> None:
        self.usage[team_id] = self.usage.get(team_id, 0.0) + units * self.config.fairshare_admit_charge_s
        self.charges += 1

    def __iter__(self) -> Iterator[PendingJob]:
        if self.config.ordering == "fifo":
            yield from sorted(self.jobs, key=lambda j: (j.submitted_at, j.id))
            return
        if self.config.ordering == "sjf":
            inf = float("inf")
            yield from sorted(self.jobs, key=lambda j: (j.estimated_runtime_s or inf, j.submitted_at, j.id))
            return
        # One sort, in each team's own order (user priority, then submission): every queue split from it below
        # (by class, team and service class) is then already in that order.
        by_class: dict[int, list[PendingJob]] = {}
        # (By submission, then by priority, highest first: Python's sorts are stable, also reversed, and two sorts
        # on C attribute getters cost less than one on a tuple built per job.)
        in_team_order = sorted(sorted(self.jobs, key=_SUBMITTED), key=_PRIORITY, reverse=True)
        for j in in_team_order:
            queue = by_class.get(j.qos_priority)
            if queue is None:
                by_class[j.qos_priority] = [j]
            else:
                queue.append(j)
        # The segments in order: each a list of jobs taken as they are (those at risk) or a mapping of teams'
        # queues to merge by fair share. Classes are taken in tiers, highest first: within a tier, every class's
        # jobs at risk (highest class first), then the others by service class, and class within one.
        segments: list[list[PendingJob] | dict[int, list[PendingJob]]] = []
        critical = self._critical(in_team_order) if self.config.makespan_guard is not None else []
        if self.config.backlog_bound is not None:
            critical = self._overdue(in_team_order, {j.id for j in critical}) + critical
        if critical:
            ids = {j.id for j in critical}
            by_class = {
                prio: kept for prio, queue in by_class.items() if (kept := [j for j in queue if j.id not in ids])
            }
        split = {prio: self._split(by_class[prio]) for prio in sorted(by_class, reverse=True)}
        for tier in self._tiers(by_class):
            segments.extend(split[prio][0] for prio in tier)
            if critical and any(by_class[prio][0].preemptible for prio in tier):
                segments.append(critical)  # the first tier with a preemptible class, after its jobs at risk
                critical = []
            for sc in sorted({sc for prio in tier for sc in split[prio][1]}):
                segments.extend(split[prio][1][sc] for prio in tier if sc in split[prio][1])
        if critical:  # no preemptible class has other jobs waiting: after everything else
            segments.append(critical)
        usage, weight = self.usage, self.weight
        heapreplace = heapq.heapreplace
        for per_team in segments:
            if isinstance(per_team, list):
                yield from per_team
                continue
            # Merge the teams' queues: the team with the least usage per unit of weight goes next. Only an
            # admission changes a score (``charge``), so a team keeps its turn until one: between admissions whole
            # runs of one team's queue go by without touching the heap.
            if len(per_team) == 1:  # one team: its own order, no merging (charges cannot reorder it)
                yield from next(iter(per_team.values()))
                continue
            heap = [(self.score(tid), tid) for tid in per_team]
            heapq.heapify(heap)
            taken = dict.fromkeys(per_team, 0)  # jobs of each team's queue yielded so far
            while heap:
                score, tid = heap[0]
                current = usage.get(tid, 0.0) / max(weight.get(tid, 1.0), 1e-9)  # self.score(tid), inlined
                if current != score:  # charged since it was pushed
                    heapreplace(heap, (current, tid))
                    continue
                queue = per_team[tid]
                i, n = taken[tid], len(queue)
                charges = self.charges
                while i < n:
                    job = queue[i]
                    i += 1
                    yield job
                    if self.charges != charges:
                        break
                taken[tid] = i
                # Charged (or done): the heap is untouched since, so its top is still this team's entry.
                if i < n:
                    heapreplace(heap, (usage.get(tid, 0.0) / max(weight.get(tid, 1.0), 1e-9), tid))
                else:
                    heapq.heappop(heap)

    def _critical(self, jobs: list[PendingJob]) -> list[PendingJob]:
        """The makespan guard (``PolicyConfig.makespan_guard``): the jobs of preemptible classes expected to run
        longer than a fraction of the time the cluster needs to drain all the work it knows of (pending jobs'
        expected GPU-seconds and running jobs' until their projected ends, over its GPUs), longest first, at most
        ``makespan_guard_jobs``. Longest-processing-time first for the jobs that would otherwise set the makespan:
        left to the end of a backlog, such a job runs on an emptying cluster. Jobs at risk of their queue-wait
        SLA or with a deadline keep their own lane. They may reserve but never preempt (``aged``)."""
        config = self.config
        if self.estimator is None or self.capacity <= 0 or config.makespan_guard is None:
            return []
        remaining_s = self.estimator.remaining_s
        min_s = config.makespan_guard_min_s
        patience = config.makespan_guard_wait
        risk = 1 - config.sla_reserve_fraction
        now = self.now
        candidates: list[tuple[float, PendingJob]] = []
        for j in jobs:
            if not j.gpus:
                continue
            remaining = remaining_s(j.team_id, j.estimated_runtime_s, j.attained_s)
            if not j.preemptible or remaining < min_s or j.deadline is not None or j.share is not None:
                continue
            if now - j.submitted_at < patience * remaining:
                continue  # not kept waiting long enough, for how long it is to run
            due = j.queue_wait_due
            if due is not None and now < due <= now + risk * (j.max_queue_wait_s or 0.0):
                continue  # at risk of its SLA: its own lane
            candidates.append((remaining, j))
        if not candidates:
            return []
        threshold = max(min_s, config.makespan_guard * self._drain_s(jobs))
        chosen = sorted((t for t in candidates if t[0] >= threshold), key=lambda t: (-t[0], t[1].submitted_at, t[1].id))
        critical = [j for _r, j in chosen[: config.makespan_guard_jobs]]
        for j in critical:
            self.urgent.add(j.id)
            self.aged.add(j.id)  # reserves, never preempts
        return critical

    def _overdue(self, jobs: list[PendingJob], taken: set[int]) -> list[PendingJob]:
        """The backlog bound (``PolicyConfig.backlog_bound``): the jobs of preemptible classes that have been queued
        (since submission, less the time they ran) at least ``backlog_bound`` times the time the cluster needs to
        drain the work it knows of, if they could outlast that backlog (no time limit, or more of it left than
        the drain time), or ``backlog_bound_short`` times it otherwise; the most time-limit left first (a job
        without a limit first), then the oldest; at most ``backlog_bound_jobs``. FIFO bounds every job's wait by
        the backlog ahead of it; the service order does not, and a long or large low-class job it keeps passing
        over starts only once the backlog is gone, on an emptying cluster, which then idles while it runs. A job
        that could run longer than the backlog takes to drain is the one that sets the makespan if it starts
        late: it is overdue sooner, and first (longest-processing-time first, on the only upper bound kiln has:
        the user's limit). A job whose limit ends within the drain time cannot set the makespan, and the service
        order keeps it longer. They may reserve but never preempt (``aged``)."""
        config = self.config
        if self.estimator is None or self.capacity <= 0 or config.backlog_bound is None:
            return []
        drain = self._drain_s(jobs)
        long_before = self.now - config.backlog_bound * drain  # queued since at or before: overdue
        short = config.backlog_bound_short
        short_before = -math.inf if short is None else self.now - short * drain
        overdue: list[tuple[float, float, int, PendingJob]] = []
        for j in jobs:
            if not (j.preemptible and j.gpus and j.share is None and j.id not in taken):
                continue
            queued_since = j.submitted_at + j.attained_s
            left = math.inf if j.estimated_runtime_s is None else j.estimated_runtime_s - j.attained_s
            if queued_since <= (long_before if left >= drain else short_before):
                overdue.append((-left, j.submitted_at, j.id, j))
        overdue.sort(key=operator.itemgetter(0, 1, 2))
        lane = [j for *_key, j in overdue[: config.backlog_bound_jobs]]
        for j in lane:
            self.urgent.add(j.id)
            self.aged.add(j.id)  # reserves, never preempts
        return lane

    def _drain_s(self, jobs: list[PendingJob]) -> float:
        """Seconds the cluster needs to finish the work it knows of, once a cycle: the pending GPU jobs' expected
        GPU-seconds (kiln's estimates, as the order uses them; never a true run time) plus the running jobs' until
        their projected ends, over the cluster's GPUs."""
        if self._drain is None:
            assert self.estimator is not None
            remaining_s = self.estimator.remaining_s
            pending_gpu_s = sum(j.gpus * remaining_s(j.team_id, j.estimated_runtime_s, j.attained_s) for j in jobs)
            self._drain = (pending_gpu_s + self.running_gpu_s) / self.capacity
        return self._drain

    def _tiers(self, by_class: dict[int, list[PendingJob]]) -> list[list[int]]:
        """The classes (priorities) in tiers, highest first (``PolicyConfig.class_order``)."""
        classes = sorted(by_class, reverse=True)
        order = self.config.class_order
        if order == "strict" or self.estimator is None:
            return [[prio] for prio in classes]
        if order == "service":
            return [classes]
        # "guaranteed": each non-preemptible class on its own, then the preemptible ones together
        preemptible = [prio for prio in classes if by_class[prio][0].preemptible]
        return [[prio] for prio in classes if prio not in preemptible] + ([preemptible] if preemptible else [])

    def _split(self, jobs: list[PendingJob]) -> tuple[list[PendingJob], dict[int, dict[int, list[PendingJob]]]]:
        """A class's jobs (in team order): those at risk, most urgent first; and the rest by team, one mapping
        per service class (one mapping, class 0, for all when there are no service classes)."""
        urgent: list[tuple[float, float, int, PendingJob]] = []
        per_team: dict[int, list[PendingJob]] = {}
        now, config = self.now, self.config
        keep = config.keep_reservations
        held = Reason.RESERVATION.value
        sla = config.sla_urgency
        risk = 1 - config.sla_reserve_fraction
        after_breach = config.urgent_after_breach
        age = config.starvation_age_s
        for j in jobs:
            # ``urgency(j, now, config)``, inlined but for deadlines
            u: float | None = None
            if sla:
                if j.deadline is not None:
                    u = urgency(j, now, config)
                else:
                    wait = j.max_queue_wait_s
                    if wait is not None:
                        started = j.wait_started_at
                        due = (started if started is not None else j.submitted_at) + wait
                        if due - now <= risk * wait and (after_breach or due > now):
                            u = due - now
                    elif age is not None and now - j.submitted_at >= age:
                        u = j.submitted_at + 2 * age - now
            if keep and j.pending_reason == held:
                u = -math.inf  # held capacity last cycle (or preempted for it): first, so the capacity is not lost
            if u is not None:
                urgent.append((u, j.submitted_at, j.id, j))
                self.urgent.add(j.id)
            else:
                queue = per_team.get(j.team_id)
                if queue is None:
                    per_team[j.team_id] = [j]
                else:
                    queue.append(j)
        aging = config.oldest_first_after_s
        if aging is not None and per_team:
            oldest = min((j for q in per_team.values() for j in q), key=lambda j: (j.submitted_at, j.id))
            if now - oldest.submitted_at >= aging:
                per_team[oldest.team_id].remove(oldest)
                if not per_team[oldest.team_id]:
                    del per_team[oldest.team_id]
                urgent.append((math.inf, oldest.submitted_at, oldest.id, oldest))
                self.urgent.add(oldest.id)
                self.aged.add(oldest.id)
        urgent.sort(key=lambda t: t[:3])
        ordered = [item[3] for item in urgent]
        if self.estimator is None:
            return ordered, {0: per_team} if per_team else {}
        return ordered, self._by_service(per_team)

    def _by_service(self, per_team: dict[int, list[PendingJob]]) -> dict[int, dict[int, list[PendingJob]]]:
        """Split each team's queue by service class (``service_class`` of GPUs x ``Estimator.remaining_s``,
        inlined: the same arithmetic, without a call per job)."""
        assert self.estimator is not None
        history = self.estimator.history
        base = self.config.service_base_gpu_s
        log_factor = math.log(self.config.service_factor)
        log = math.log
        by_service: dict[int, dict[int, list[PendingJob]]] = {}
        for tid, queue in per_team.items():
            h = history.get(tid)
            use = h.limit_use if h is not None else DEFAULT_LIMIT_USE
            for j in queue:
                limit = j.estimated_runtime_s
                if limit is not None:
                    remaining = max(MIN_REMAINING_S, (limit - j.attained_s) * use)
                else:
                    remaining = self.estimator.remaining_s(tid, None, j.attained_s)
                gpu_s = (j.gpus if j.gpus else j.cpu_slots) * remaining
                sc = 0 if gpu_s <= base else 1 + int(log(gpu_s / base) / log_factor)
                teams = by_service.get(sc)
                if teams is None:
                    teams = by_service[sc] = {}
                mine = teams.get(tid)
                if mine is None:
                    teams[tid] = [j]
                else:
                    mine.append(j)
        return by_service
