"""Knobs of the policy. A frozen value passed to ``plan()``; the live loop and the simulator build their own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    # "kiln": QoS classes, SLA urgency, fair share, quotas, backfill, reservations, preemption.
    # "fifo": submission order, the head blocks everything behind it (the baseline of the simulator).
    ordering: Literal["kiln", "fifo"] = "kiln"
    placement: Literal["pack", "spread"] = "pack"
    backfill: bool = True
    preemption: bool = True
    enforce_quotas: bool = True
    enforce_budgets: bool = True
    # A job is "at risk" once it has waited this fraction of its max queue wait: it sorts ahead of its class
    # and capacity is reserved for it (Volcano's waiting-time SLA).
    sla_reserve_fraction: float = 0.5
    # Deadline-aware ordering: a job whose projected finish leaves less slack than this is urgent.
    deadline_slack_s: float = 3600.0
    max_reservations: int = 8  # jobs that hold a reservation in one cycle (class heads and at-risk jobs)
    # The first job of each QoS class that cannot be placed holds a reservation (not only the first overall), so
    # a large low-class job is not starved by a stream of small jobs of its own class.
    reserve_per_class: bool = True
    # Jobs without an SLA count as "at risk" (sort ahead of their class, oldest first, may reserve) once they
    # have waited this long: aging within a class. None = no aging.
    starvation_age_s: float | None = 86400.0
    # A job whose stored pending reason is Reservation (it held capacity, or preempted for it, last cycle) goes
    # first in its class, so the capacity its victims free is not handed to another job, which would preempt anew.
    keep_reservations: bool = True
    # Preempt only when waiting would be too late: when the job's projected start from running jobs' ends (time
    # limits) is after its queue-wait SLA / deadline, or after now + ``preempt_patience_s`` for a job without
    # one, or unknown. None = preempt whenever a job of a higher class cannot be placed (the old behaviour).
    preempt_patience_s: float | None = 86400.0
    max_preemptors: int = 8  # jobs that may trigger preemption in one cycle
    max_preempt_searches: int = 32  # victim searches per cycle (each costs placement trials)
    max_victim_candidates: int = 64
    min_run_time_s: float = 300.0  # a job is not preempted before it has run this long
    # A job may preempt its own team's jobs of a strictly lower class, preemptible or not (Kueue's
    # withinClusterQueue: LowerPriority): a team over its quota trades its own silver for its own gold, where
    # without this its gold job waits behind the team's own lower-class work. Other teams' non-preemptible jobs
    # are still taken only as reclaim victims (borrowed quota).
    preempt_own_lower_classes: bool = True
    # Anti-thrash: in victim order, each earlier preemption of a candidate counts as this many seconds of lost
    # work on each of its GPUs, so the same long job is not pushed back again and again (to the tail).
    victim_preempted_penalty_s: float = 900.0
    fairshare_admit_charge_s: float = 3600.0  # usage charged per admitted GPU within a cycle (ordering only)
