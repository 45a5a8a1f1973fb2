"""Why a job waits: Slurm's ``squeue`` REASON, kiln's vocabulary. Exactly these eight."""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    QUOTA = "Quota"  # the team's quota (and what the cohort may lend) is used up
    BUDGET = "Budget"  # the team's GPU-hour budget for the period is spent
    RESOURCES = "Resources"  # not enough free GPUs / slots of the kind it needs (or a restart backoff)
    PRIORITY = "Priority"  # the capacity it could use is held for a higher-priority job
    DEPENDENCY = "Dependency"  # a job it depends on has not succeeded yet
    BANDWIDTH_QUOTA = "BandwidthQuota"  # GPUs are free but the host links cannot carry its bandwidth quota
    MEMORY_FIT = "MemoryFit"  # its predicted memory exceeds its QoS memory cap or every eligible GPU
    RESERVATION = "Reservation"  # capacity is being reserved for it (SLA, head of queue, or preemption)
