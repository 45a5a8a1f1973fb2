"""Trace replay in simulated time, through the very same ``plan()`` as the live loop, against the baselines.

``python -m scheduler.simulate TRACE [--hosts N[,M...]] [--gpus-per-host 8] [--period 3600] [--jobs N] [--out DIR]``
(``TRACE`` = a Philly-format JSON file, or ``synthetic:N`` for a generated one.) Every policy and baseline replays
the same trace on the same cluster under the same model, each size and policy in its own process.

Model (stated, so the figures can be judged):

* **work** = the trace's ``runtime`` (first attempt's start to last attempt's end). The trace's failed attempts
  are inside it and are not replayed (not on top of it, not as separate failures): a job runs its runtime once,
  unless preempted. So the live loop's restart backoff and ``max_restarts``, which apply to failures, never
  trigger; a preemption is not a restart there either (requeued with its progress, no backoff, not counted).
* **a preemption costs** what it costs in kiln: the job keeps its GPUs ``STOP_S`` (60 s) to checkpoint on SIGTERM
  and exit; it keeps only the progress of its last periodic checkpoint (every ``CHECKPOINT_S`` = 30 min of
  training; conservatively, as if the SIGTERM checkpoint were lost); on restart it holds its GPUs ``RESTORE_S`` +
  ``WARM_COMPILE_S`` (120 + 60 s) before it trains again. All of that is GPU time lost (``lost_gpu_h``).
* **time limits** are enforced as ``plan()`` enforces them live (every attempt's run counted, after a minute of
  grace): a job preempted often enough to run past its limit fails (``jobs_failed``); its GPU time counts as lost,
  its work as not done (not in ``util_makespan``) and its JCT is left out of the mean (the table's JCT is over the
  jobs that finished).
* **what the policy knows** (``Submission`` and the observed state only; no job view carries the trace's
  runtime): the user's time limit, modelled as users give them (``scheduler.simulate.limits``, ``--limits``): none
  for 40% of jobs; otherwise the run time times a log-normal overestimate (median 3x, sigma 0.8, at least 1.1x),
  rounded up to 1, 2, 4, 8, 12 h, 1, 2, 3, 5, 7, 14, 30 or 60 days (seeded per job id); with ``--limits
  underestimating`` a share of the limits (15%) is below the run time instead: such a job is killed at its limit,
  its run lost, and resubmitted by its user 30 minutes later with twice the limit, as a new job (its JCT counts
  from the first submission, its waits all count, its killed runs are ``lost_gpu_h``); the job's attained service
  (seconds its earlier attempts ran); the team's finished jobs (their run times and the share of their limits they
  used).
  The one exception is the ``sjf-oracle`` baseline, given each job's true runtime as its limit: a bound, not a
  policy one can run.
* each trace job gets a team and a QoS class from SHA-256 of its id: byte 0 picks the class (15% gold, 30% silver,
  30% bronze, 25% best-effort), byte 1 the team (``team0``..``team5``); max queue wait gold 30 min, silver 2 h,
  bronze 8 h, best-effort none. **Wait** = all time queued (the first wait and every requeue after a
  preemption); a job meets its queue-wait SLA when all of its waits add up to at most its max wait, and the
  policy is told the budget left.
* team quotas (kiln and the priority baseline): each team's nominal is an even share of the GPUs, one cohort, all
  lendable, borrowing unlimited: an idle team's share is lent and reclaimed when that team needs it.
* a cycle runs on every arrival, end and stop, when a waiting job reaches 50%, 90% and 100% of its max wait (or
  its aging age), and every ``--period`` seconds while jobs wait (the live loop's timer).
* utilisation: ``util_makespan`` = useful GPU time (the trace's work, the same for every policy) over each
  policy's own makespan; ``busy_window`` = GPU time held (useful or lost) over the submission window.

``--holdout`` replays EASY and kiln on the parts of the trace the defaults were not tuned on
(``scheduler.simulate.holdout``).

Policies: ``fifo`` (strict, the head blocks); ``easy`` (EASY backfill: FIFO, the head reserves, later jobs
backfill on their time limits; jobs without one do not backfill into a reservation); ``priority`` (Slurm
multifactor / Kueue ClusterQueue: QoS class, fair share, age; backfill; lower classes preempted at once, quotas
with reclaim); ``kiln`` (the live loop's policy, from the ``KILN_POLICY__*`` settings); ``sjf-oracle`` (shortest
true runtime first, with backfill on true runtimes: the ORACLE BOUND).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from core.policy_config import PolicyConfig
from core.settings import get_settings
from core.states import JobState, Reason
from scheduler.policy.plan import plan
from scheduler.policy.snapshot import ANY, HostInfo, PendingJob, PlacedHost, QuotaInfo, RunningJob, Snapshot, TeamInfo
from scheduler.simulate import holdout
from scheduler.simulate.limits import (
    LIMIT_SEED,
    MODELS,
    OVERESTIMATING,
    RESUBMIT_DELAY_S,
    LimitModel,
    resubmitted_limit,
)
from scheduler.simulate.limits import model as limit_model
from scheduler.simulate.synthetic import gpu_cluster

CLASSES = {
    "gold": (1000, False, 1800.0),
    "silver": (500, False, 7200.0),
    "bronze": (200, True, 28800.0),
    "best-effort": (0, True, None),
}
TEAMS = 6
COHORT = "philly"
CHECKPOINT_S = 1800.0  # the trainers' checkpoint interval
STOP_S = 60.0  # SIGTERM -> checkpoint -> exit
RESTORE_S = 120.0  # a restarted attempt loads its checkpoint
WARM_COMPILE_S = 60.0  # and compiles from the warm cache (bench/results/compile_warm_probe_v3.json: 17 s ready)
RESTART_S = RESTORE_S + WARM_COMPILE_S
CYCLE_S = 3600.0  # a cycle at least this often while jobs wait
HISTORY = 200  # finished jobs per team the policy is told about
ORACLE = "sjf-oracle"


def policies() -> dict[str, tuple[PolicyConfig, bool]]:
    """Every policy replayed: name -> (config, given the true runtimes?)."""
    plain = PolicyConfig(ordering="fifo", backfill=False, enforce_quotas=False, preemption=False)
    head_only = plain.model_copy(update={"backfill": True, "max_reservations": 1, "reserve_per_class": False})
    return {
        "fifo": (plain, False),
        "easy": (head_only, False),
        "priority": (
            PolicyConfig(
                ordering="priority",
                sla_urgency=False,
                starvation_age_s=None,
                preempt_patience_s=None,
                preempt_only_at_risk=False,
                max_preemptions_per_job=None,
                service_classes=False,
            ),
            False,
        ),
        "kiln": (get_settings().policy, False),  # the live loop's policy, from the same KILN_POLICY__* settings
        ORACLE: (head_only.model_copy(update={"ordering": "sjf"}), True),
    }


@dataclass(frozen=True)
class TraceJob:
    id: str
    gpus: int
    submit: float
    work: float  # the trace's runtime, seconds: failed attempts and the gaps between them are inside it
    attempts: int = 1  # scheduling attempts in the trace (informational: they are not replayed on top of work)


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


class Observer(Protocol):
    """Watches a replay from outside the policy (the start-time forecast measurement): told of each cycle's new
    submissions with the snapshot ``plan()`` is about to get, and of every start."""

    def submitted(self, sim: Simulation, snapshot: Snapshot, job_ids: list[int]) -> None: ...

    def started(self, job_id: int, now: float) -> None: ...


def qos_and_team(job_id: str) -> tuple[str, int]:
    digest = hashlib.sha256(job_id.encode()).digest()
    pct = digest[0] * 100 // 256
    qos = "gold" if pct < 15 else "silver" if pct < 45 else "bronze" if pct < 75 else "best-effort"
    return qos, digest[1] % TEAMS


def _parse_ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def load_trace(path: str, limit: int | None = None) -> list[TraceJob]:
    if path.startswith("synthetic:"):
        return synthetic_trace(int(path.split(":", 1)[1]))
    raw = json.loads(Path(path).read_text())
    jobs = [
        TraceJob(
            str(e["id"]),
            int(e["num_gpus"]),
            _parse_ts(e["submitted_time"]),
            float(e["runtime"]) * 60.0,
            max(1, len(e.get("attempts") or ())),
        )
        for e in raw
    ]
    jobs.sort(key=lambda j: (j.submit, j.id))
    if limit:
        jobs = jobs[:limit]
    t0 = jobs[0].submit if jobs else 0.0
    return [replace(j, submit=j.submit - t0) for j in jobs]


def synthetic_trace(n: int, *, seed: int = 7, load_gpus: float = 40.0) -> list[TraceJob]:
    """Philly-like: 4/8 GPU jobs mostly, some 16/32, heavy-tailed run times."""
    rng = random.Random(seed)
    sizes = [4] * 48 + [8] * 44 + [16] * 5 + [32] * 3
    mean_work = 4 * 3600.0
    mean_gpus = sum(sizes) / len(sizes)
    rate = load_gpus / (mean_gpus * mean_work)  # arrivals per second for the target average demand
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        work = min(rng.lognormvariate(math.log(mean_work) - 0.5, 1.0), 40 * 3600.0)
        out.append(TraceJob(f"synthetic_{i:05d}", rng.choice(sizes), t, max(600.0, work)))
    return out


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


def window_utilisation(r: Result) -> float:
    """Time-averaged busy fraction over the submission window (the series is a step function)."""
    if r.window <= 0 or not r.series:
        return 0.0
    area = 0.0
    for (t, _q, busy), (t_next, _q2, _b2) in zip(r.series, [*r.series[1:], (r.window, 0, 0)], strict=True):
        lo, hi = min(t, r.window), min(t_next, r.window)
        if hi > lo:
            area += busy * (hi - lo)
    return area / (r.gpus * r.window)


def idle_while_queued_gpu_h(r: Result) -> float:
    idle = 0.0
    for (t, queued, busy), (t_next, _q, _b) in zip(r.series, [*r.series[1:], (r.makespan, 0, 0)], strict=True):
        if queued:
            idle += (r.gpus - busy) * max(0.0, t_next - t)
    return idle / 3600


class Simulation:
    def __init__(
        self,
        trace: Sequence[TraceJob],
        hosts: tuple[HostInfo, ...],
        config: PolicyConfig,
        *,
        tick: float = 0.0,
        period: float = CYCLE_S,
        oracle: bool = False,
        limit_seed: int = LIMIT_SEED,
        limits: LimitModel = OVERESTIMATING,
        observer: Observer | None = None,
    ) -> None:
        self.hosts = hosts
        self.gpus = sum(len(h.gpus) for h in hosts)
        self.config = config
        self.tick = tick
        self.period = period
        self.oracle = oracle
        # Team quotas: the cluster split evenly (the remainder to the first teams), all in one cohort, everything
        # lendable and borrowable: an idle team's share is lent, and reclaimed when that team needs it.
        self.nominal = [self.gpus // TEAMS + (1 if i < self.gpus % TEAMS else 0) for i in range(TEAMS)]
        self.borrowed_gpu_s = [0.0] * TEAMS
        self.used_gpu_s = [0.0] * TEAMS
        self.jobs: dict[int, SimJob] = {}
        self._work: dict[int, float] = {}  # the trace's runtime: the truth, read only to end jobs (and by the oracle)
        self.arrivals: list[tuple[float, int]] = []
        for i, tj in enumerate(trace, 1):
            qos, team = qos_and_team(tj.id)
            # The oracle baseline is told each job's true run time as its time limit: an exact estimate.
            limit = tj.work if oracle else limits.draw(tj.id, tj.work, limit_seed)
            self.jobs[i] = SimJob(Submission(i, tj.id, tj.gpus, tj.submit, qos, team, limit))
            self._work[i] = tj.work
            self.arrivals.append((tj.submit, i))
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self.events: list[tuple[float, int, int, str, int]] = []  # (time, seq, job, kind, attempt)
        self.seq = 0
        self.usage = [0.0] * TEAMS
        self.usage_t = 0.0
        self.preemptions = self.reclaims = 0
        self.busy_gpu_s = self.lost_gpu_s = 0.0
        self.history: list[list[tuple[float, float | None]]] = [[] for _ in range(TEAMS)]  # (run time, limit)
        self.teams_view: tuple[TeamInfo, ...] | None = None
        self.views: dict[int, tuple[int, float | None, RunningJob]] = {}  # job -> (attempt, checkpoint, view)
        self.limits = limits
        self.resubmitting = 0  # jobs killed at their limit whose users have not resubmitted them yet
        self.kills = 0
        self.observer = observer
        self.submitted_now: list[int] = []  # submissions since the last cycle, for the observer

    def push(self, t: float, job: int, kind: str, attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, job, kind, attempt))

    # -- what plan() sees ----------------------------------------------------------------------------------------

    def _pending_view(self, jid: int, now: float) -> PendingJob:
        sj = self.jobs[jid]
        sub = sj.sub
        prio, pre, max_wait = CLASSES[sub.qos]
        # All waits of this submission count (a resubmission is a new job, with a budget of its own).
        budget = None if max_wait is None else max(0.0, max_wait - sj.queued_s + sj.waited_before_s)
        return PendingJob(
            id=jid,
            team_id=sub.team,
            qos=sub.qos,
            qos_priority=prio,
            preemptible=pre,
            gpus=sub.gpus,
            submitted_at=sub.submit,
            gpus_per_node=8 if sub.gpus > 8 and sub.gpus % 8 == 0 else None,
            quota_key=ANY,
            max_queue_wait_s=budget,
            estimated_runtime_s=sub.time_limit_s,
            attained_s=sj.attained_s,
            wait_started_at=now,
            pending_reason=Reason.PREEMPTED.value if sj.preemptions else None,
        )

    def _running_view(self, jid: int, now: float) -> RunningJob:
        sj = self.jobs[jid]
        ckpt = self._checkpoint_at(sj, now)
        seen = self.views.get(jid)
        if seen is not None and seen[0] == sj.attempt and seen[1] == ckpt and not sj.preempting:
            return seen[2]
        sub = sj.sub
        prio, pre, _ = CLASSES[sub.qos]
        limit = sub.time_limit_s
        view = RunningJob(
            id=jid,
            team_id=sub.team,
            qos=sub.qos,
            qos_priority=prio,
            preemptible=pre,
            gpus=sub.gpus,
            gpu_type="H100",
            quota_key=ANY,
            placement=sj.placement,
            started_at=sj.attempt_start,
            last_checkpoint_at=ckpt,
            expected_end=None if limit is None else sj.attempt_start + limit,
            time_limit_s=limit,
            preemptions=sj.preemptions,
            attained_s=sj.attained_s,
            preempt_requested=sj.preempting,
            state=(JobState.PREEMPTING if sj.preempting else JobState.RUNNING).value,
        )
        self.views[jid] = (sj.attempt, ckpt, view)
        return view

    @staticmethod
    def _checkpoint_at(sj: SimJob, now: float) -> float | None:
        """The attempt's last periodic checkpoint (every CHECKPOINT_S of training, after restore and compile)."""
        trained = now - sj.attempt_start - sj.overhead
        if trained < CHECKPOINT_S:
            return None
        return sj.attempt_start + sj.overhead + math.floor(trained / CHECKPOINT_S) * CHECKPOINT_S

    def _teams(self) -> tuple[TeamInfo, ...]:
        if self.teams_view is None or any(t.decayed_usage != self.usage[t.id] for t in self.teams_view):
            infos = []
            for i, n in enumerate(self.nominal):
                hist = self.history[i][-HISTORY:]
                ratios = sorted(rt / lim for rt, lim in hist if lim)
                infos.append(
                    TeamInfo(
                        i,
                        f"team{i}",
                        cohort=COHORT,
                        quotas=(QuotaInfo(ANY, n),),
                        decayed_usage=self.usage[i],
                        finished_runtimes_s=tuple(sorted(rt for rt, _ in hist)),
                        limit_use_ratio=ratios[len(ratios) // 2] if ratios else None,
                    )
                )
            self.teams_view = tuple(infos)
        return self.teams_view

    def snapshot(self, now: float) -> Snapshot:
        running = tuple(self._running_view(jid, now) for jid in self.running)
        return Snapshot(
            now=now, hosts=self.hosts, running=running, pending=tuple(self.pending.values()), teams=self._teams()
        )

    # -- the replay ----------------------------------------------------------------------------------------------

    def _decay(self, now: float) -> None:
        dt = now - self.usage_t
        if dt <= 0:
            return
        f = 0.5 ** (dt / self.config.fairshare_half_life_s)
        per_team = [0] * TEAMS
        for jid in self.running:
            per_team[self.jobs[jid].sub.team] += self.jobs[jid].sub.gpus
        self.usage = [u * f + per_team[i] * dt for i, u in enumerate(self.usage)]
        for i in range(TEAMS):
            self.used_gpu_s[i] += per_team[i] * dt
            self.borrowed_gpu_s[i] += max(0, per_team[i] - self.nominal[i]) * dt
        self.usage_t = now

    def _submit(self, jid: int, now: float) -> None:
        """A user submits the job (or resubmits it): queued, and the observer told at the next cycle."""
        self._enqueue(jid, now)
        self.submitted_now.append(jid)

    def _enqueue(self, jid: int, now: float) -> None:
        sj = self.jobs[jid]
        sj.queued_since = now
        self.pending[jid] = self._pending_view(jid, now)
        sub = sj.sub
        max_wait = CLASSES[sub.qos][2]
        if max_wait is not None:  # cycles when its standing changes: at risk of its SLA, near breach
            budget = max(0.0, max_wait - sj.queued_s + sj.waited_before_s)
            for frac in (self.config.sla_reserve_fraction, 0.9):
                self.push(now + frac * budget, jid, "wake", sj.attempt)
        elif self.config.starvation_age_s is not None and sj.attempt == sj.first_attempt:
            self.push(sub.submit + self.config.starvation_age_s, jid, "wake", sj.attempt)

    def _start(self, jid: int, placement: tuple[PlacedHost, ...], now: float, reason: str | None) -> None:
        sj = self.jobs[jid]
        del self.pending[jid]
        assert sj.queued_since is not None
        before = sj.queued_s
        sj.queued_s += now - sj.queued_since
        sj.queued_since = None
        max_wait = CLASSES[sj.sub.qos][2]
        if max_wait is not None and before <= max_wait < sj.queued_s:
            sj.miss_reason = reason or "none"
        if sj.first_start is None:
            sj.first_start = now
        sj.attempt += 1
        sj.attempt_start = now
        # A restart restores its checkpoint and compiles warm; a resubmission starts afresh, as the first did.
        sj.overhead = RESTART_S if sj.attempt > sj.first_attempt + 1 else 0.0
        sj.placement = placement
        sj.preempting = False
        self.running[jid] = self._running_view(jid, now)
        self.push(now + sj.overhead + self._work[jid] - sj.progress, jid, "end", sj.attempt)
        limit = sj.sub.time_limit_s
        if limit is not None:  # a cycle once it is past its limit and the grace, as the live loop's timer would run
            kill_at = now + limit - sj.attained_s + self.config.time_limit_grace_s + 1.0
            self.push(max(now, kill_at), jid, "limit", sj.attempt)
        if self.observer is not None:
            self.observer.started(jid, now)

    def _release(self, jid: int, now: float, useful: float) -> None:
        """The attempt ends at ``now`` having added ``useful`` seconds of lasting progress."""
        sj = self.jobs[jid]
        del self.running[jid]
        self.views.pop(jid, None)
        held = now - sj.attempt_start
        self.busy_gpu_s += sj.sub.gpus * held
        self.lost_gpu_s += sj.sub.gpus * max(0.0, held - useful)
        sj.attained_s += held
        sj.progress += useful

    def _event(self, t: float, jid: int, kind: str, attempt: int) -> None:
        sj = self.jobs[jid]
        if kind == "resubmit":
            self.resubmitting -= 1
            self._submit(jid, t)
            return
        if kind in ("wake", "limit") or jid not in self.running or attempt != sj.attempt:
            return  # a wake or a limit only makes the cycle run; plan() decides
        if kind == "end":  # finished (also when a preemption was asked too late to matter)
            self._release(jid, t, self._work[jid] - sj.progress)
            sj.finish = t
            self.history[sj.sub.team].append((sj.attained_s, sj.sub.time_limit_s))
            self.teams_view = None
        elif kind == "stopped" and sj.preempting:  # checkpointed on SIGTERM and exited: back in the queue
            self._release(jid, t, sj.kept - sj.progress)
            self._enqueue(jid, t)

    def _stale(self, event: tuple[float, int, int, str, int]) -> bool:
        _t, _seq, jid, kind, attempt = event
        sj = self.jobs[jid]
        if kind == "resubmit":
            return False
        if attempt != sj.attempt:
            return True
        if kind == "wake":
            return sj.queued_since is None
        return jid not in self.running

    def _preempt(self, jid: int, now: float, reclaim: bool) -> None:
        sj = self.jobs[jid]
        sj.preempting = True
        sj.preemptions += 1
        self.preemptions += 1
        self.reclaims += reclaim
        # Conservatively, the steps since the last periodic checkpoint are lost (as if the SIGTERM checkpoint
        # failed or timed out); the STOP_S it takes to stop are lost too.
        ckpt = self._checkpoint_at(sj, now)
        trained = 0.0 if ckpt is None else ckpt - sj.attempt_start - sj.overhead
        sj.kept = min(self._work[jid], sj.progress + trained)
        self.running[jid] = self._running_view(jid, now)
        self.push(now + STOP_S, jid, "stopped", sj.attempt)

    def true_remaining_s(self, jid: int, now: float) -> float:
        """The running job's true training time left: for measurements outside the policy only (the start-time
        forecasts' bound of what progress reports would tell, ``scheduler.simulate.forecasts``)."""
        sj = self.jobs[jid]
        trained = max(0.0, now - sj.attempt_start - sj.overhead)
        return max(0.0, self._work[jid] - sj.progress - trained)

    def _fail(self, jid: int, now: float, message: str) -> None:
        sj = self.jobs[jid]
        self._release(jid, now, 0.0)
        sj.failed = message

    def _kill_and_resubmit(self, jid: int, now: float) -> None:
        """Killed at its time limit: everything the job ran is lost (a new kiln job resumes nothing of it, so the
        progress its earlier attempts kept is lost too), and its user submits it again, with a longer limit."""
        sj = self.jobs[jid]
        kept = sj.progress
        self._release(jid, now, 0.0)
        self.lost_gpu_s += sj.sub.gpus * kept
        self.kills += 1
        sj.kills += 1
        sj.original = sj.original or sj.sub
        assert sj.sub.time_limit_s is not None  # only a job with a limit is killed at it
        again = now + RESUBMIT_DELAY_S
        sj.sub = replace(sj.sub, submit=again, time_limit_s=resubmitted_limit(sj.sub.time_limit_s))
        sj.progress = sj.attained_s = 0.0
        sj.preemptions = 0
        sj.waited_before_s = sj.queued_s
        sj.first_attempt = sj.attempt
        self.resubmitting += 1
        self.push(again, jid, "resubmit", sj.attempt)

    def run(self, name: str) -> Result:
        arrivals = sorted(self.arrivals)
        ai = 0
        now = 0.0
        cycles = 0
        plan_s: list[float] = []
        series: list[tuple[float, int, int]] = []
        last_cycle = -math.inf
        while ai < len(arrivals) or self.running or self.pending or self.resubmitting:
            while self.events and self._stale(self.events[0]):
                # Superseded (an end of an attempt that was preempted, a wake for a wait that is over): no cycle for
                # it, or the cycles' timing would tell plan() when a preempted attempt would have ended.
                heapq.heappop(self.events)
            next_arrival = arrivals[ai][0] if ai < len(arrivals) else math.inf
            next_event = self.events[0][0] if self.events else math.inf
            # Nothing left to arrive, run, wake or resubmit: what still waits can never start (larger than the
            # cluster, or behind such a job's reservation), and the timer's cycles would change nothing.
            idle = ai >= len(arrivals) and not self.running and not self.events and not self.resubmitting
            periodic = last_cycle + self.period if self.pending and self.period > 0 and not idle else math.inf
            nxt = min(next_arrival, next_event, periodic)
            if nxt == math.inf:
                break  # pending jobs that can never run (larger than the cluster)
            # Event-driven (tick 0): a cycle at every arrival, end, stop and SLA wake-up, as the live loop runs
            # one on every NOTIFY, and every ``period`` while jobs wait, as its timer does.
            now = max(now, math.ceil(nxt / self.tick) * self.tick if self.tick > 0 else nxt)
            while ai < len(arrivals) and arrivals[ai][0] <= now:
                self._submit(arrivals[ai][1], now)
                ai += 1
            while self.events and self.events[0][0] <= now:
                t, _s, jid, kind, attempt = heapq.heappop(self.events)
                self._event(t, jid, kind, attempt)
            self._decay(now)
            snap = self.snapshot(now)
            if self.observer is not None and self.submitted_now:
                self.observer.submitted(self, snap, self.submitted_now)
            self.submitted_now = []
            t0 = time.perf_counter()
            decisions = plan(snap, self.config)
            plan_s.append(time.perf_counter() - t0)
            cycles += 1
            last_cycle = now
            for kill in decisions.time_limit_kills:
                if self.limits.resubmit:
                    self._kill_and_resubmit(kill.job_id, now)
                else:
                    self._fail(kill.job_id, now, kill.message)
            reasons = {w.job_id: w.reason for w in decisions.pending}
            for adm in decisions.admissions:
                place = tuple(PlacedHost(p.host, p.gpus) for p in adm.placement)
                self._start(adm.job_id, place, now, self.pending[adm.job_id].pending_reason)
            for jid, reason in reasons.items():  # stored as the live loop's apply does: the next cycle sees it
                pj = self.pending.get(jid)
                if pj is not None and pj.pending_reason != reason:
                    self.pending[jid] = replace(pj, pending_reason=str(reason))
            for pre in decisions.preemptions:
                self._preempt(pre.job_id, now, "reclaimed" in pre.reason)
            busy = sum(self.jobs[j].sub.gpus for j in self.running)
            if series and series[-1][0] == now:
                series.pop()
            series.append((now, len(self.pending), busy))
        finished = [j.finish for j in self.jobs.values() if j.finish is not None]
        makespan = max(finished, default=now)
        window = max((a[0] for a in arrivals), default=0.0)
        work = sum(self._work[i] * j.sub.gpus for i, j in self.jobs.items() if j.finish is not None)
        return Result(
            name,
            list(self.jobs.values()),
            work,
            self.busy_gpu_s,
            self.lost_gpu_s,
            makespan,
            self.gpus,
            self.preemptions,
            self.reclaims,
            cycles,
            plan_s,
            series,
            window,
            list(zip(self.used_gpu_s, self.borrowed_gpu_s, strict=True)),
            self.oracle,
            self.limits.name,
        )


def summarize(r: Result) -> dict[str, Any]:
    done = [j for j in r.jobs if j.finish is not None]
    jct = [j.finish - j.submitted_at for j in done]  # type: ignore[operator]
    wait = [j.queued_s for j in done]

    def stats(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {"mean_h": 0.0, "p50_h": 0.0, "p95_h": 0.0}
        s = sorted(xs)
        return {
            "mean_h": round(statistics.fmean(s) / 3600, 3),
            "p50_h": round(s[len(s) // 2] / 3600, 3),
            "p95_h": round(s[min(len(s) - 1, int(0.95 * len(s)))] / 3600, 3),
        }

    sla: dict[str, dict[str, Any]] = {}
    for qos, (_p, _pre, max_wait) in CLASSES.items():
        js = [j for j in r.jobs if j.sub.qos == qos]
        met = sum(1 for j in js if j.finish is not None and (max_wait is None or j.queued_s <= max_wait))
        sla[qos] = {
            "jobs": len(js),
            "attainment": round(met / len(js), 4) if js else 1.0,
            "mean_wait_h": round(statistics.fmean([j.queued_s for j in js]) / 3600, 3) if js else 0.0,
            "missed_by_reason": dict(sorted(Counter(j.miss_reason for j in js if j.miss_reason).items())),
        }
    plans = sorted(r.plan_s)
    return {
        "policy": r.name,
        "oracle": r.oracle,
        "jobs_finished": len(done),
        "jobs_total": len(r.jobs),
        "jobs_failed": sum(1 for j in r.jobs if j.failed),
        "limits": r.limits,
        # Killed at a limit below their run time and resubmitted (the underestimating model): their runs are lost.
        "jobs_killed_at_limit": sum(1 for j in r.jobs if j.kills),
        "kills_at_limit": sum(j.kills for j in r.jobs),
        "jct": stats(jct),
        "wait": stats(wait),
        "util_makespan": round(r.work_gpu_s / (r.gpus * r.makespan), 4) if r.makespan else 0.0,
        "busy_window": round(window_utilisation(r), 4),
        "makespan_days": round(r.makespan / 86400, 2),
        "idle_while_queued_gpu_h": round(idle_while_queued_gpu_h(r)),
        "sla_attainment": sla,
        "preemptions": r.preemptions,
        "preemptions_per_job": round(r.preemptions / max(1, len(r.jobs)), 3),
        "reclaim_preemptions": r.reclaims,
        "lost_gpu_h": round(r.lost_gpu_s / 3600, 1),
        "teams": [
            {"team": f"team{i}", "gpu_h": round(u / 3600), "borrowed_gpu_h": round(b / 3600)}
            for i, (u, b) in enumerate(r.teams)
        ],
        "cycles": r.cycles,
        "plan_ms_mean": round(1000 * statistics.fmean(plans), 3) if plans else 0.0,
        "plan_ms_p95": round(1000 * plans[min(len(plans) - 1, int(0.95 * len(plans)))], 3) if plans else 0.0,
    }


def acceptance(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 16's targets for kiln against the best baseline that does not know true runtimes."""
    kiln = next(s for s in summaries if s["policy"] == "kiln")
    base = [s for s in summaries if s["policy"] != "kiln" and not s["oracle"]]
    best_jct = min(base, key=lambda s: s["jct"]["mean_h"])
    best_util = max(base, key=lambda s: s["util_makespan"])
    cut = 1 - kiln["jct"]["mean_h"] / best_jct["jct"]["mean_h"] if best_jct["jct"]["mean_h"] else 0.0
    return {
        "gold_sla": kiln["sla_attainment"]["gold"]["attainment"],
        "gold_sla_ok": kiln["sla_attainment"]["gold"]["attainment"] >= 0.99,
        "best_baseline_jct": best_jct["policy"],
        "jct_cut_vs_best_baseline": round(cut, 4),
        "jct_ok": cut >= 0.20,
        "best_baseline_util": best_util["policy"],
        "util_makespan_gap_points": round(100 * (kiln["util_makespan"] - best_util["util_makespan"]), 2),
        "util_ok": kiln["util_makespan"] >= best_util["util_makespan"] - 0.01,
        "preemptions_per_job": kiln["preemptions_per_job"],
        "preemptions_ok": kiln["preemptions_per_job"] <= 0.5,
        "lost_gpu_h": kiln["lost_gpu_h"],
    }


def plot(results: list[Result], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, idx, label in (("queue", 1, "pending jobs"), ("utilisation", 2, "busy GPUs (%)")):
        fig, ax = plt.subplots(figsize=(9, 3.5))
        for r in results:
            ts = [s[0] / 86400 for s in r.series]
            ys = [s[idx] if idx == 1 else 100 * s[idx] / r.gpus for s in r.series]
            ax.plot(ts, ys, label=r.name, linewidth=0.8)
        ax.set_xlabel("simulated days")
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"simulate_{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def table(summaries: list[dict[str, Any]]) -> str:
    head = (
        "| policy | mean JCT h | p50 JCT h | p95 JCT h | mean wait h | p95 wait h | util (makespan) | "
        "makespan d | gold SLA | silver SLA | bronze SLA | preemptions / job | lost GPU-h |"
    )
    lines = [head, "|" + "---|" * 13]
    for s in summaries:
        sla = s["sla_attainment"]
        name = f"{s['policy']} (ORACLE BOUND)" if s["oracle"] else s["policy"]
        lines.append(
            f"| {name} | {s['jct']['mean_h']:.1f} | {s['jct']['p50_h']:.1f} | {s['jct']['p95_h']:.1f} | "
            f"{s['wait']['mean_h']:.1f} | {s['wait']['p95_h']:.1f} | {s['util_makespan']:.1%} | "
            f"{s['makespan_days']:.1f} | {sla['gold']['attainment']:.1%} | {sla['silver']['attainment']:.1%} | "
            f"{sla['bronze']['attainment']:.1%} | {s['preemptions_per_job']:.3f} | {s['lost_gpu_h']:,.0f} |"
        )
    return "\n".join(lines)


def offered_load(trace: Sequence[TraceJob], gpus: int) -> float:
    """GPU time the trace asks for (its runtimes) over the GPU time of its submission window."""
    window = max((j.submit for j in trace), default=0.0)
    demand = sum(j.gpus * j.work for j in trace)
    return demand / (gpus * window) if window > 0 and gpus else 0.0


def replay_one(
    trace: Sequence[TraceJob],
    hosts: int,
    gpus_per_host: int,
    name: str,
    tick: float,
    period: float,
    limit_seed: int = LIMIT_SEED,
    limits: LimitModel = OVERESTIMATING,
) -> Result:
    config, oracle = policies()[name]
    sim = Simulation(
        trace,
        gpu_cluster(hosts, gpus_per_host),
        config,
        tick=tick,
        period=period,
        oracle=oracle,
        limit_seed=limit_seed,
        limits=limits,
    )
    return sim.run(name)


K = TypeVar("K")


def replay_all(argsets: dict[K, tuple[Any, ...]], workers: int, finished: Callable[[K, Result], None]) -> None:
    """``replay_one(*args)`` for each entry, each in its own process (at most ``workers``), ``finished`` called as
    each is done (a long run can be read, or resumed by hand, part-way)."""
    if workers <= 1 or len(argsets) == 1:
        for key, a in argsets.items():
            finished(key, replay_one(*a))
        return
    with ProcessPoolExecutor(max_workers=min(len(argsets), workers)) as pool:
        futures = {pool.submit(replay_one, *a): key for key, a in argsets.items()}
        for future in as_completed(futures):
            finished(futures[future], future.result())


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,M,...: {text!r}") from None


def _hosts(text: str) -> list[int]:
    sizes = _ints(text)
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"host counts must be >= 1: {text!r}")
    return sizes


def _seeds(text: str) -> list[int]:
    seeds = _ints(text)
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed given twice: {text!r}")
    return seeds


def across_draws(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 16's targets on each draw of the users' limits (``--limit-seed N,M,...``), per size and in all: a policy
    that meets them on one draw only is tuned to that draw."""
    sizes: dict[int, dict[str, Any]] = {}
    every: list[int] = []
    for draw in draws:
        seed, met_all = draw["limit_seed"], True
        for entry in draw["sizes"]:
            a = entry.get("acceptance")
            if a is None:
                return {}
            met = all(a[k] for k in ("gold_sla_ok", "jct_ok", "util_ok", "preemptions_ok"))
            met_all = met_all and met
            row = sizes.setdefault(entry["hosts"], {"hosts": entry["hosts"], "met_on": [], "by_seed": {}})
            row["by_seed"][str(seed)] = {
                k: a[k]
                for k in ("jct_cut_vs_best_baseline", "util_makespan_gap_points", "gold_sla", "preemptions_per_job")
            }
            if met:
                row["met_on"].append(seed)
        if met_all:
            every.append(seed)
    return {"seeds": [d["limit_seed"] for d in draws], "every_target_met_on": every, "sizes": list(sizes.values())}


def _policy_names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in policies()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown policy {unknown or text!r}; choose from {', '.join(policies())}")
    return names


def _draw(
    trace: Sequence[TraceJob],
    seed: int,
    sizes: list[int],
    names: list[str],
    gpus_per_host: int,
    summarized: dict[tuple[int, int, str], dict[str, Any]],
) -> dict[str, Any]:
    """One draw's tables (one per size) and acceptance, printed and returned for the report."""
    entries = []
    for n in sizes:
        summaries = [summarized[(seed, n, p)] for p in names]
        load = offered_load(trace, n * gpus_per_host)
        entry: dict[str, Any] = {
            "hosts": n,
            "gpus": n * gpus_per_host,
            "offered_load": round(load, 3),
            "results": summaries,
        }
        if "kiln" in names and len(names) > 1 and any(p != "kiln" and p != ORACLE for p in names):
            entry["acceptance"] = acceptance(summaries)
        entries.append(entry)
        print(
            f"\n{n} hosts x {gpus_per_host} GPUs ({n * gpus_per_host} GPUs, offered load {load:.2f}), limit seed {seed}"
        )
        print(table(summaries))
        if "acceptance" in entry:
            print("acceptance:", json.dumps(entry["acceptance"]))
    return {"limit_seed": seed, "sizes": entries}


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1: {text!r}")
    return share


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kiln simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="Philly-format JSON, or synthetic:N")
    ap.add_argument(
        "--hosts",
        type=_hosts,
        default=[40],
        help="hosts (default 40); a list (40,48,52) replays each size: one table per size",
    )
    ap.add_argument("--gpus-per-host", type=int, default=8)
    ap.add_argument(
        "--policies",
        type=_policy_names,
        default=list(policies()),
        help=f"comma-separated subset of {', '.join(policies())} (default: all)",
    )
    ap.add_argument(
        "--tick",
        type=float,
        default=0.0,
        help="0: a cycle on every event (default); else cycles rounded up to multiples of this (s)",
    )
    ap.add_argument("--period", type=float, default=CYCLE_S, help="a cycle at least this often while jobs wait (s)")
    ap.add_argument("--jobs", type=int, default=None, help="replay only the first N jobs")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes replaying in parallel")
    ap.add_argument("--out", default="simulate-out")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--limit-seed",
        type=_seeds,
        default=[LIMIT_SEED],
        help=f"draw the users' time limits with another seed (default {LIMIT_SEED}); a list (16,7,3) replays each "
        "draw and reports on which the targets hold (a policy tuned to one draw shows it)",
    )
    ap.add_argument(
        "--limits",
        choices=list(MODELS),
        default=OVERESTIMATING.name,
        help="the users' time limits: overestimating (default: never below 1.1x the run time) or "
        "underestimating (a share of them below it: killed at the limit, resubmitted with twice it)",
    )
    ap.add_argument(
        "--underestimate-share",
        type=_share,
        default=None,
        help="with --limits underestimating: the share of the jobs with a limit that get one below their "
        "run time (default 0.15)",
    )
    ap.add_argument(
        "--holdout",
        action="store_true",
        help="replay EASY and kiln on the parts of the trace the defaults were not tuned on: each half by "
        "submission time at 40, 48 and 52 hosts, and the whole trace at 36, 44, 56 and 64 (instead of --hosts and "
        "--policies)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limits = limit_model(args.limits, args.underestimate_share)
    trace = load_trace(args.trace, args.jobs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.holdout:
        return _holdout(trace, args, limits, out)
    started = time.perf_counter()
    sizes: list[int] = args.hosts
    names: list[str] = args.policies
    seeds: list[int] = args.limit_seed
    # policy by policy, so the first finish first
    tasks = [(seed, n, p) for seed in seeds for p in names for n in sizes]
    argsets = [(trace, n, args.gpus_per_host, p, args.tick, args.period, seed, limits) for seed, n, p in tasks]
    done: dict[tuple[int, int, str], Result] = {}
    summarized: dict[tuple[int, int, str], dict[str, Any]] = {}

    def finished(task: tuple[int, int, str], result: Result) -> None:
        done[task] = result
        summarized[task] = summarize(result)
        seed, n, p = task
        name = f"replay_{n}_{p}.json" if len(seeds) == 1 else f"replay_{n}_{p}_seed{seed}.json"
        (out / name).write_text(json.dumps(summarized[task], indent=2) + "\n")
        print(f"done: {n} hosts, {p}" + (f", limit seed {seed}" if len(seeds) > 1 else ""), flush=True)

    replay_all(dict(zip(tasks, argsets, strict=True)), args.workers, finished)
    wall_s = round(time.perf_counter() - started, 1)
    print(f"{len(trace)} jobs; {len(tasks)} replays took {wall_s} s")
    draws = [_draw(trace, seed, sizes, names, args.gpus_per_host, summarized) for seed in seeds]
    report = _report(args, limits, len(trace), wall_s) | {"sizes": draws[0]["sizes"]}
    if len(seeds) > 1:
        report["draws"] = draws
        report["across_draws"] = across_draws(draws)
        if report["across_draws"]:
            print("\nacross draws:", json.dumps(report["across_draws"]))
    plots: list[str] = []
    if not args.no_plots:
        plots = plot([done[(seeds[0], sizes[0], p)] for p in names], out)
        for p in plots:
            print("plot:", p)
    report["plots"] = plots
    (out / "simulate.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _report(args: argparse.Namespace, limits: LimitModel, jobs: int, wall_s: float) -> dict[str, Any]:
    policy = get_settings().policy  # the live loop's policy (each replay process reads the same settings)
    return {
        "trace": args.trace,
        "jobs": jobs,
        "gpus_per_host": args.gpus_per_host,
        "tick_s": args.tick,
        "period_s": args.period,
        "limit_seed": args.limit_seed[0],
        "limits": limits.name,
        "underestimate_share": limits.underestimate_share,
        "wall_s": wall_s,
        "policy": policy.model_dump(),
    }


def _holdout(trace: list[TraceJob], args: argparse.Namespace, limits: LimitModel, out: Path) -> int:
    """``--holdout``: EASY and kiln on each held-out part (``holdout.parts``), one table of kiln against EASY."""
    started = time.perf_counter()
    seed = args.limit_seed[0]
    held = holdout.parts(trace)
    argsets = {
        (i, p): (list(part.jobs), part.hosts, args.gpus_per_host, p, args.tick, args.period, seed, limits)
        for p in holdout.POLICIES
        for i, part in enumerate(held)
    }
    summarized: dict[tuple[int, str], dict[str, Any]] = {}

    def finished(task: tuple[int, str], result: Result) -> None:
        summarized[task] = summarize(result)
        i, p = task
        (out / f"holdout_{held[i].key}_{p}.json").write_text(json.dumps(summarized[task], indent=2) + "\n")
        print(f"done: {held[i].name}, {held[i].hosts} hosts, {p}", flush=True)

    replay_all(argsets, args.workers, finished)
    wall_s = round(time.perf_counter() - started, 1)
    rows = [
        holdout.compare(
            part,
            offered_load(part.jobs, part.hosts * args.gpus_per_host),
            summarized[(i, "easy")],
            summarized[(i, "kiln")],
        )
        for i, part in enumerate(held)
    ]
    print(f"\nheld out ({limits.name} limits, seed {seed}; {len(argsets)} replays took {wall_s} s)")
    print(holdout.table(rows))
    report = _report(args, limits, len(trace), wall_s) | {"holdout": rows}
    (out / "holdout.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
