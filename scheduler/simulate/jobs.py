"""What a replay knows of each job (the user's submission, the job as the replay observes it), and what a replay
yields."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.policy.snapshot import PlacedHost
from scheduler.simulate.limits import OVERESTIMATING


@dataclass(frozen=True, slots=True)
class Submission:
    """What a user hands kiln for a trace job, and so all the policy ever learns about it up front.

    There is no run-time field: the job views given to ``plan()`` are built from this and from what the replay
    observed (attained service, checkpoints, waits), never from the trace's runtime (``Simulation._work``)."""

    key: int
    name: str
    gpus: int
    submit: float
    qos: str
    team: int
    time_limit_s: float | None


@dataclass
class SimJob:
    """A job as the replay observes it (no run time: that is ``Simulation._work``)."""

    sub: Submission
    queued_since: float | None = None  # in the queue since (None: not arrived, running or done)
    queued_s: float = 0.0  # all time queued so far: the first wait and every requeue
    first_start: float | None = None
    finish: float | None = None
    failed: str | None = None
    attempt: int = 0  # attempts started
    attempt_start: float = 0.0
    overhead: float = 0.0  # restore + warm compile at the start of this attempt (0 for the first)
    progress: float = 0.0  # useful seconds done, as of the last checkpoint kept (the restart point)
    kept: float = 0.0  # progress a requested preemption keeps (the last periodic checkpoint)
    attained_s: float = 0.0  # seconds its ended attempts held their GPUs
    preemptions: int = 0
    preempting: bool = False
    miss_reason: str | None = None  # its pending reason when its waits went past its max queue wait
    placement: tuple[PlacedHost, ...] = ()
    # Killed at a time limit below its run time and resubmitted (the underestimating limit model): ``sub`` is then
    # the resubmission, a new job to kiln (its own limit, wait budget and attempts), ``original`` the first one.
    original: Submission | None = None
    kills: int = 0
    waited_before_s: float = 0.0  # queued_s when the current submission was made
    first_attempt: int = 0  # ``attempt`` when the current submission was made

    @property
    def submitted_at(self) -> float:
        """When the user first submitted the job: its completion time counts from there, resubmissions included."""
        return (self.original or self.sub).submit


@dataclass
class Result:
    name: str
    jobs: list[SimJob]
    work_gpu_s: float  # useful GPU time: the trace's work, the same for every policy
    busy_gpu_s: float  # GPU time held by jobs, useful or lost
    lost_gpu_s: float  # held without lasting progress: stops, restores and compiles, steps since the checkpoint
    makespan: float
    gpus: int
    preemptions: int
    reclaims: int
    cycles: int
    plan_s: list[float]
    series: list[tuple[float, int, int]] = field(default_factory=list)  # (t, queue length, busy GPUs)
    window: float = 0.0
    teams: list[tuple[float, float]] = field(default_factory=list)  # per team: (GPU-seconds used, borrowed)
    oracle: bool = False
    limits: str = OVERESTIMATING.name
