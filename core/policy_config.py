"""The scheduling policy's knobs: a frozen value passed to ``plan()``.

The operator sets them as ``KILN_POLICY__<FIELD>`` (``core.settings``); the live loop and ``kiln simulate`` read them
once at start-up and pass them in, so the pure policy never reads the environment.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class SettingsGroup(BaseModel):
    """A group of settings read from the environment: an empty value of an optional setting is "not set"."""

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if value == "" and field is not None and type(None) in get_args(field.annotation):
            return None
        return value


class PolicyConfig(SettingsGroup):
    """How the scheduler orders, places and preempts jobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ordering: Literal["kiln", "fifo", "priority", "sjf"] = Field(
        default="kiln",
        description="`kiln`: QoS classes, SLA urgency, service classes, fair share, quotas, backfill, "
        "reservations, preemption. The simulator's baselines: `fifo` (submission order; without backfill the head "
        "blocks everything behind it, with backfill EASY), `priority` (class, fair share, age: Slurm's multifactor "
        "order), `sjf` (shortest time limit first; the oracle bound when given true run times).",
    )
    time_limit_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="A job still RUNNING this long past its time limit (every attempt's run counted) is failed by "
        "the scheduler: the backstop, since its worker stops it at the limit itself (checkpoint first) and should win.",
    )
    placement: Literal["pack", "spread"] = Field(
        default="pack",
        description="Where a job that fits on one host goes: `pack` the host it fits best (keeps whole hosts "
        "free for gang jobs), `spread` the host with the most free GPUs.",
    )
    backfill: bool = Field(
        default=True, description="Smaller jobs may run ahead of a blocked one where they do not delay it."
    )
    preemption: bool = Field(default=True, description="A job of a higher class may preempt jobs of lower classes.")
    enforce_quotas: bool = Field(
        default=True, description="Teams' GPU quotas (nominal, borrowing and lending limits) hold."
    )
    enforce_budgets: bool = Field(default=True, description="Teams' GPU-hour budgets hold.")
    sla_reserve_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A job is at risk once it has waited this fraction of its max queue wait: it sorts ahead of "
        "its class and capacity is reserved for it.",
    )
    deadline_slack_s: float = Field(
        default=3600.0,
        ge=0,
        description="A job whose projected finish leaves less slack than this before its deadline is urgent.",
    )
    max_reservations: int = Field(
        default=8, ge=0, description="Jobs that hold a reservation in one cycle (class heads and at-risk jobs)."
    )
    reserve_per_class: bool = Field(
        default=True,
        description="The first job of each QoS class that cannot be placed holds a reservation (not only "
        "the first overall), so a large low-class job is not starved by a stream of small jobs of its own class.",
    )
    starvation_age_s: float | None = Field(
        default=None,
        ge=0,
        description="Jobs without an SLA count as at risk once they have waited this long (aging within a class: "
        "oldest first). Empty (the default): no aging; the backlog bound bounds every wait. On the Philly replay a "
        "day of aging cost mean JCT at 48 and 52 hosts and bought nothing the backlog bound's order does not "
        "(docs/scheduler.md).",
    )
    oldest_first_after_s: float | None = Field(
        default=None,
        ge=0,
        description="The oldest job of each class that has waited this long (since submission) goes first among "
        "its class's jobs not at risk and may hold a reservation, but never preempts: the service-class order "
        "cannot starve a large job forever. Empty: off.",
    )
    makespan_guard: float | None = Field(
        default=None,
        gt=0,
        description="The makespan guard (LPT): a pending job of a preemptible class whose expected remaining run "
        "time (kiln's estimate: the user's limit scaled by the team's use of its limits, or the team's history) is "
        "at least this fraction of the time the cluster needs to finish all the work it knows of (pending jobs' "
        "expected GPU-seconds plus running jobs' until their projected ends, over the cluster's GPUs) goes first in "
        "the first tier with a preemptible class, longest first, and may hold a reservation, but never preempts: "
        "a long job left to the end of a backlog would run on an emptying cluster. Empty: off.",
    )
    makespan_guard_min_s: float = Field(
        default=86400.0,
        ge=0,
        description="The makespan guard takes only jobs expected to run at least this long.",
    )
    makespan_guard_wait: float = Field(
        default=0.0,
        ge=0,
        description="The makespan guard takes only jobs that have waited (since submission) at least this fraction "
        "of their expected remaining run time: where the backlog drains soon anyway, a long job is not put ahead "
        "of short ones before it has been kept waiting.",
    )
    makespan_guard_jobs: int = Field(
        default=2, ge=0, description="The makespan guard takes at most this many jobs a cycle (the longest)."
    )
    backlog_bound: float | None = Field(
        default=1.0,
        gt=0,
        description="A bound on waiting that the service order lacks: a pending job of a preemptible class that "
        "could outlast the backlog (no time limit, or more of its limit left than the time the cluster needs to "
        "drain all the work it knows of, counted as the makespan guard counts it) and has been queued (since "
        "submission, less the time it ran) at least this many times that drain time goes first in the first tier "
        "with a preemptible class, the most time-limit left first (a job without a limit first), and may hold a "
        "reservation, but never preempts. FIFO would have started such a job by now; left to the service order, a "
        "long or large low-class job waits until the backlog is gone and then runs on an emptying cluster. Empty: "
        "off.",
    )
    backlog_bound_short: float | None = Field(
        default=2.0,
        gt=0,
        description="The backlog bound for a job whose time limit ends within the drain time: it cannot set the "
        "makespan, so the service order keeps it longer. Empty: no bound for such jobs.",
    )
    backlog_bound_jobs: int = Field(
        default=16, ge=0, description="The backlog bound takes at most this many jobs a cycle (the first by its order)."
    )
    keep_reservations: bool = Field(
        default=True,
        description="A job that held a reservation (or preempted for it) last cycle goes first in its "
        "class, so the capacity its victims free is not handed to another job, which would preempt anew.",
    )
    preempt_patience_s: float | None = Field(
        default=86400.0,
        ge=0,
        description="Preempt only when waiting would be too late: when the job's projected start "
        "(from running jobs' time limits) is after its queue-wait SLA or deadline, after now + this for a job "
        "without one, or unknown. Empty: preempt whenever a job of a higher class cannot be placed.",
    )
    max_preemptors: int = Field(default=8, ge=0, description="Jobs that may trigger preemption in one cycle.")
    max_preempt_searches: int = Field(
        default=32, ge=0, description="Victim searches per cycle (each costs placement trials)."
    )
    max_victim_candidates: int = Field(
        default=64, ge=0, description="Running jobs considered as victims in one search."
    )
    preempt_only_at_risk: bool = Field(
        default=True,
        description="A preemption budget: only a job at risk of its queue-wait SLA (or holding a reservation "
        "since the last cycle) preempts; the others wait for capacity to free up.",
    )
    max_preemptions_per_job: int | None = Field(
        default=1,
        ge=0,
        description="A job already preempted this many times is not taken again. Empty: no cap.",
    )
    uncapped_preemptor_priority: int | None = Field(
        default=1000,
        description="Jobs of this class priority or higher are not held to `max_preemptions_per_job` as "
        "preemptors (gold's queue wait first). Empty: everyone is.",
    )
    min_run_time_s: float = Field(
        default=300.0, ge=0, description="A job is not preempted before it has run this long."
    )
    preempt_own_lower_classes: bool = Field(
        default=True,
        description="A job may preempt its own team's jobs of a strictly lower class, preemptible or not, "
        "so a team over its quota trades its own lower-class work for its higher-class job. Other teams' "
        "non-preemptible jobs are taken only as reclaim victims (borrowed quota).",
    )
    victim_preempted_penalty_s: float = Field(
        default=900.0,
        ge=0,
        description="In victim order, each earlier preemption of a candidate counts as this many "
        "seconds of lost work on each of its GPUs, so the same long job is not pushed back again and again.",
    )
    sla_urgency: bool = Field(
        default=True, description="SLA urgency (queue-wait and deadline risk, aging) in the order."
    )
    urgent_after_breach: bool = Field(
        default=False,
        description="A job whose queue-wait SLA is already broken stays urgent (most overdue first). Off: "
        "under a lasting backlog every late job would be urgent and its class would run oldest first.",
    )
    service_classes: bool = Field(
        default=True,
        description="Within a class, order by discretised expected remaining service (the user's time limit, "
        "the attained service, the team's finished jobs; never the true run time), and project running jobs "
        "without a time limit to end when the team's history expects.",
    )
    class_order: Literal["strict", "service", "guaranteed"] = Field(
        default="strict",
        description="`strict`: a QoS class's jobs all go before a lower class's. `service`: the jobs at risk of "
        "their SLA go first, every class's (highest class first); the others by service class first and QoS class "
        "within it, so a short job of a lower class is not held behind a long one of a higher class that its SLA "
        "does not need to hurry. `guaranteed`: the non-preemptible classes strictly, each before the next; the "
        "preemptible ones together as `service` orders them.",
    )
    service_base_gpu_s: float = Field(
        default=4 * 3600.0, gt=0, description="Expected GPU-seconds below which a job is in service class 0."
    )
    service_factor: float = Field(default=4.0, gt=1, description="Each further service class is this many times more.")
    fairshare_admit_charge_s: float = Field(
        default=3600.0,
        ge=0,
        description="Fair-share usage charged per GPU a team is admitted within one cycle "
        "(ordering only), so one team does not take the whole cycle's capacity.",
    )
    fairshare_half_life_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="Fair share weighs a team's past GPU usage halved for every this many seconds since it ended, "
        "so last week's heavy user is not penalised forever; the dashboard's fair share uses the same.",
    )
