"""The immutable picture of the cluster that ``plan()`` decides over.

Everything is a frozen dataclass of tuples, so a snapshot can be hashed, compared and shared between the live
loop and the trace simulator. Times are POSIX seconds (UTC) as floats: the policy does arithmetic on them in its
inner loops, and the loader converts the database's timezone-aware datetimes at the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.states import JobState

CPU = "cpu"  # the quota key and "GPU type" of CPU-slot jobs
ANY = "*"  # the quota key that covers every GPU type


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: str
    index: int
    model: str
    memory_bytes: int
    nvlink_peers: tuple[str, ...] = ()
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class HostInfo:
    name: str
    queue: str
    gpus: tuple[GpuInfo, ...] = ()
    cpu_slots: int = 0
    links: tuple[tuple[str, float], ...] = ()  # link name -> capacity, bytes/s
    excluded: bool = False
    mps: bool = False  # its MPS daemon runs: it may hold fractional jobs
    runs_team_code: bool = True  # its worker sandboxes attempts (or was told not to): a team's own code may run there


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A fractional job's part of one GPU. ``guaranteed``: its SMs are promised (a non-preemptible class), so
    the guaranteed shares on a GPU never add up past 100%; a best-effort share only fills what is left idle."""

    memory_bytes: int
    sm_percent: int
    guaranteed: bool


@dataclass(frozen=True, slots=True)
class PlacedHost:
    host: str
    gpus: tuple[str, ...] = ()  # GPU uuids
    slots: int = 0  # CPU slots (CPU jobs)


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: int
    team_id: int
    qos: str
    qos_priority: int
    preemptible: bool
    gpus: int  # GPUs, or CPU slots for CPU jobs
    gpu_type: str  # the model it runs on, or CPU
    quota_key: str
    placement: tuple[PlacedHost, ...]
    started_at: float
    last_checkpoint_at: float | None = None
    last_checkpoint_step: int = 0
    bandwidth: tuple[tuple[str, float], ...] = ()  # link name -> bytes/s charged on every host it uses
    expected_end: float | None = None  # started_at + time limit (or the simulator's knowledge)
    time_limit_s: float | None = None
    preempt_requested: bool = False
    state: str = JobState.RUNNING.value
    preemptions: int = 0  # times this job has been preempted before (PREEMPTING events; the simulator counts)
    share: GpuShare | None = None  # a fractional job: its part of its one GPU
    sweep_id: int | None = None  # the sweep it belongs to, if any
    attained_s: float = 0.0  # seconds its earlier attempts ran (attained service, before this attempt)


@dataclass(frozen=True, slots=True)
class PendingJob:
    id: int
    team_id: int
    qos: str
    qos_priority: int
    preemptible: bool
    gpus: int  # GPUs; 0 = a CPU job of ``cpu_slots`` processes
    submitted_at: float
    gpus_per_node: int | None = None
    gpu_type: str | None = None  # None = any model
    cpu_slots: int = 1
    quota_key: str = ANY
    priority: int = 0  # the user's priority within the class
    max_queue_wait_s: float | None = None
    deadline: float | None = None
    # The user's time limit (spec.time_limit_s), None when not given: an upper bound a user chose, usually several
    # times too long. Never the true run time: nothing that plan() sees carries it (the simulator's oracle
    # baseline is the one exception, labelled as such).
    estimated_runtime_s: float | None = None
    memory_bytes: int | None = None  # the memory predictor's peak per rank, when known
    memory_cap_bytes: int | None = None  # the QoS class's GPU memory cap
    bandwidth: tuple[tuple[str, float], ...] = ()
    depends_on: tuple[tuple[int, str, str], ...] = ()  # (job id, its state, condition: afterok/afterany/afternotok)
    not_before: float | None = None
    pending_reason: str | None = None  # as stored, so that apply writes only changes
    attained_s: float = 0.0  # seconds its earlier attempts ran (attained service; 0 for a job never started)
    # When this wait began (None: at submission). ``max_queue_wait_s`` is the queue-wait budget left for it, so a
    # requeued job's earlier waits count against its SLA.
    wait_started_at: float | None = None
    # Hosts its last attempt was LOST on: a restart goes elsewhere when anywhere else fits (a soft preference:
    # a one-host cluster still restarts it there; DOWN and EXCLUDED hosts are avoided outright).
    avoid_hosts: frozenset[str] = frozenset()
    share: GpuShare | None = None  # a fractional job (resources.gpu_share, resolved against its class)
    team_code: bool = False  # it runs its team's own code (an upload, a script): only on hosts that sandbox it
    sweep_id: int | None = None  # the sweep it belongs to, if any...
    sweep_limit: int | None = None  # ...and how many of that sweep's jobs may run at once (None: no limit)

    @property
    def queue_wait_due(self) -> float | None:
        """When its queue-wait SLA breaks, if it has one."""
        if self.max_queue_wait_s is None:
            return None
        start = self.wait_started_at if self.wait_started_at is not None else self.submitted_at
        return start + self.max_queue_wait_s

    @property
    def demand(self) -> int:
        """Units of its quota key: GPUs, or CPU slots for a CPU job."""
        return self.gpus if self.gpus else self.cpu_slots


@dataclass(frozen=True, slots=True)
class QuotaInfo:
    key: str  # a GPU model, ANY or CPU
    nominal: int
    borrowing_limit: int | None = None  # None = unlimited within the cohort
    lending_limit: int | None = None  # None = all of the nominal may be lent


@dataclass(frozen=True, slots=True)
class TeamInfo:
    id: int
    name: str
    cohort: str | None = None
    weight: float = 1.0
    quotas: tuple[QuotaInfo, ...] = ()  # empty = no quota enforcement for this team
    decayed_usage: float = 0.0  # GPU-seconds, decayed with the fair-share half-life
    budget_gpu_hours: float | None = None
    used_gpu_hours: float = 0.0  # in the current budget period
    # kiln's own history of the team's recently finished jobs: their run times in seconds (sorted ascending), and
    # the median of run time / time limit over those that had a limit (None: no such job yet).
    finished_runtimes_s: tuple[float, ...] = ()
    limit_use_ratio: float | None = None

    def quota(self, key: str) -> QuotaInfo | None:
        for q in self.quotas:
            if q.key == key:
                return q
        return None

    def typed_gpu_quota_keys(self) -> tuple[str, ...]:
        """The team's GPU quota keys when all of them are typed (no ``*``), in its order; empty otherwise. A job
        that names no GPU type draws on the first of these with room (flavor fungibility, ``plan()``)."""
        if self.quota(ANY) is not None:
            return ()
        return tuple(q.key for q in self.quotas if q.key != CPU)


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    hosts: tuple[HostInfo, ...] = ()
    running: tuple[RunningJob, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    teams: tuple[TeamInfo, ...] = ()
    meta: tuple[tuple[str, str], ...] = field(default=())


def quota_key_for(team: TeamInfo | None, gpus: int, gpu_type: str | None, placed_type: str | None = None) -> str:
    """The quota a job draws on: CPU for CPU jobs, its GPU model if the team has a quota for it, else ANY. A
    running job that names no type (``placed_type``: the model of the GPUs it holds) of a team with typed quotas
    only draws on its GPUs' type, as ``plan()`` admitted it (flavor fungibility)."""
    if gpus == 0:
        return CPU
    if team is not None and gpu_type is not None and team.quota(gpu_type) is not None:
        return gpu_type
    if team is not None and gpu_type is None and placed_type in team.typed_gpu_quota_keys():
        return placed_type
    return ANY
