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
    max_reservations: int = 4  # jobs that hold a reservation in one cycle (the head and at-risk jobs)
    max_preemptors: int = 8  # jobs that may trigger preemption in one cycle
    max_preempt_searches: int = 32  # victim searches per cycle (each costs placement trials)
    max_victim_candidates: int = 64
    min_run_time_s: float = 300.0  # a job is not preempted before it has run this long
    fairshare_admit_charge_s: float = 3600.0  # usage charged per admitted GPU within a cycle (ordering only)
