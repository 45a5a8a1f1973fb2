"""The order in which pending jobs are considered.

``kiln``: QoS class priority first. Within a class, jobs at risk of breaking their SLA come first, earliest
breach first (queue-wait SLA once a job has waited ``sla_reserve_fraction`` of its max wait; a deadline once the
projected finish leaves less than ``deadline_slack_s``; a job without a queue-wait SLA once it has waited
``starvation_age_s``: aging, oldest first); ahead of those, jobs that held a reservation in the previous cycle
(stored reason ``Reservation``: their capacity, possibly freed by preemption for them, is not handed to
another). The rest are merged across teams by fair share: the team with the least usage per unit of weight goes
next, where usage is the decayed GPU-seconds of the snapshot plus what this cycle has admitted so far (so one
team's long queue does not take a whole cycle); within a team, by user priority, then submission time.

Within a class and after the jobs at risk, ``kiln`` orders by discretised expected remaining service
(``scheduler.policy.estimate``: GPUs x the run time still expected from the user's time limit, the attained service and
the team's history; Tiresias' least-attained-service queues with the estimates kiln really has), then by fair
share and age within one service class.

``priority`` (the Slurm multifactor / Kueue baseline): QoS class, then fair share, then age; no SLA urgency.
``fifo``: submission time, then id. ``sjf``: shortest ``estimated_runtime_s`` first (with the true run time as the
estimate, the simulator's oracle bound).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

from core.policy_config import PolicyConfig
from core.states import Reason
from scheduler.policy.estimate import Estimator, service_class
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


class JobOrder:
    """Iterates pending jobs in policy order; ``charge`` tells it what an admission cost its team."""

    def __init__(self, jobs: Sequence[PendingJob], teams: Sequence[TeamInfo], now: float, config: PolicyConfig) -> None:
        self.config = config
        self.now = now
        self.jobs = jobs
        self.usage = {t.id: t.decayed_usage for t in teams}
        self.weight = {t.id: t.weight for t in teams}
        self.urgent: set[int] = set()
        self.aged: set[int] = set()  # the oldest job of a class, long waiting: first after the at-risk, no preemption
        self.estimator = Estimator(teams) if config.ordering == "kiln" and config.service_classes else None
        self.service_memo: dict[tuple[int, float | None, float, int], int] = {}

    def score(self, team_id: int) -> float:
        return self.usage.get(team_id, 0.0) / max(self.weight.get(team_id, 1.0), 1e-9)

    def charge(self, team_id: int, units: int) -> None:
        self.usage[team_id] = self.usage.get(team_id, 0.0) + units * self.config.fairshare_admit_charge_s

    def __iter__(self) -> Iterator[PendingJob]:
        if self.config.ordering == "fifo":
            yield from sorted(self.jobs, key=lambda j: (j.submitted_at, j.id))
            return
        if self.config.ordering == "sjf":
            inf = float("inf")
            yield from sorted(self.jobs, key=lambda j: (j.estimated_runtime_s or inf, j.submitted_at, j.id))
            return
        by_class: dict[int, list[PendingJob]] = {}
        for j in self.jobs:
            by_class.setdefault(j.qos_priority, []).append(j)
        for prio in sorted(by_class, reverse=True):
            yield from self._class(by_class[prio])

    def _class(self, jobs: list[PendingJob]) -> Iterator[PendingJob]:
        urgent: list[tuple[float, float, int, PendingJob]] = []
        per_team: dict[int, list[PendingJob]] = {}
        for j in jobs:
            u = urgency(j, self.now, self.config)
            if self.config.keep_reservations and j.pending_reason == Reason.RESERVATION:
                u = -math.inf  # held capacity last cycle (or preempted for it): first, so the capacity is not lost
            if u is not None:
                urgent.append((u, j.submitted_at, j.id, j))
                self.urgent.add(j.id)
            else:
                per_team.setdefault(j.team_id, []).append(j)
        aging = self.config.oldest_first_after_s
        if aging is not None and per_team:
            oldest = min((j for q in per_team.values() for j in q), key=lambda j: (j.submitted_at, j.id))
            if self.now - oldest.submitted_at >= aging:
                per_team[oldest.team_id].remove(oldest)
                urgent.append((math.inf, oldest.submitted_at, oldest.id, oldest))
                self.urgent.add(oldest.id)
                self.aged.add(oldest.id)
        urgent.sort(key=lambda t: t[:3])
        for item in urgent:
            yield item[3]
        if self.estimator is None:
            yield from self._fair(per_team)
            return
        by_service: dict[int, dict[int, list[PendingJob]]] = {}
        for tid, queue in per_team.items():
            for j in queue:
                sc = self.service_class(j)
                by_service.setdefault(sc, {}).setdefault(tid, []).append(j)
        for sc in sorted(by_service):
            yield from self._fair(by_service[sc])

    def service_class(self, job: PendingJob) -> int:
        assert self.estimator is not None
        key = (job.team_id, job.estimated_runtime_s, job.attained_s, job.demand)
        sc = self.service_memo.get(key)  # users' limits are round figures: many jobs share one answer
        if sc is None:
            remaining = self.estimator.remaining_s(job.team_id, job.estimated_runtime_s, job.attained_s)
            sc = service_class(job.demand * remaining, self.config.service_base_gpu_s, self.config.service_factor)
            self.service_memo[key] = sc
        return sc

    def _fair(self, per_team: dict[int, list[PendingJob]]) -> Iterator[PendingJob]:
        """Merge the teams' queues: the team with the least usage per unit of weight goes next."""
        for queue in per_team.values():
            queue.sort(key=lambda j: (-j.priority, j.submitted_at, j.id), reverse=True)  # pop() from the end
        if len(per_team) == 1:  # one team: its own order, no merging (charges cannot reorder it)
            queue = next(iter(per_team.values()))
            while queue:
                yield queue.pop()
            return
        usage, weight = self.usage, self.weight
        heap = [(self.score(tid), tid) for tid in per_team]
        heapq.heapify(heap)
        while heap:
            score, tid = heap[0]
            current = usage.get(tid, 0.0) / max(weight.get(tid, 1.0), 1e-9)  # self.score(tid), inlined
            if current != score:  # charged since it was pushed
                heapq.heapreplace(heap, (current, tid))
                continue
            queue = per_team[tid]
            yield queue.pop()
            # The consumer may have charged the team meanwhile; the heap is untouched, so its top is still ours.
            if queue:
                heapq.heapreplace(heap, (usage.get(tid, 0.0) / max(weight.get(tid, 1.0), 1e-9), tid))
            else:
                heapq.heappop(heap)
