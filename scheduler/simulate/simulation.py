"""The replay's engine: a cluster in simulated time whose every cycle runs ``plan()`` on what the live loop would
see, under the model ``scheduler.simulate.replay`` states (checkpoints, stops, restores, time limits)."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from core.policy_config import PolicyConfig
from core.states import JobState, Reason
from scheduler.policy.decisions import Decisions
from scheduler.policy.plan import plan
from scheduler.policy.snapshot import ANY, HostInfo, PendingJob, PlacedHost, QuotaInfo, RunningJob, Snapshot, TeamInfo
from scheduler.simulate.jobs import Result, SimJob, Submission
from scheduler.simulate.limits import LIMIT_SEED, OVERESTIMATING, RESUBMIT_DELAY_S, LimitModel, resubmitted_limit
from scheduler.simulate.trace import CLASSES, COHORT, TEAMS, TraceJob, qos_and_team

CHECKPOINT_S = 1800.0  # the trainers' checkpoint interval
STOP_S = 60.0  # SIGTERM -> checkpoint -> exit
RESTORE_S = 120.0  # a restarted attempt loads its checkpoint
WARM_COMPILE_S = 60.0  # and compiles from the warm cache (bench/results/compile_warm_probe_v3.json: 17 s ready)
RESTART_S = RESTORE_S + WARM_COMPILE_S
CYCLE_S = 3600.0  # a cycle at least this often while jobs wait
HISTORY = 200  # finished jobs per team the policy is told about


class Observer(Protocol):
    """Watches a replay from outside the policy (the start-time forecast measurement): told of each cycle's new
    submissions with the snapshot ``plan()`` is about to get, and of every start."""

    def submitted(self, sim: Simulation, snapshot: Snapshot, job_ids: list[int]) -> None: ...

    def started(self, job_id: int, now: float) -> None: ...


class Simulation:
    """One trace replayed on one cluster under one policy (``run``), cycle by cycle in simulated time."""

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
        plan_s: list[float] = []
        series: list[tuple[float, int, int]] = []
        last_cycle = -math.inf
        while ai < len(arrivals) or self.running or self.pending or self.resubmitting:
            while self.events and self._stale(self.events[0]):
                # Superseded (an end of an attempt that was preempted, a wake for a wait that is over): no cycle for
                # it, or the cycles' timing would tell plan() when a preempted attempt would have ended.
                heapq.heappop(self.events)
            nxt = self._next_cycle(arrivals, ai, last_cycle)
            if nxt == math.inf:
                break  # pending jobs that can never run (larger than the cluster)
            # Event-driven (tick 0): a cycle at every arrival, end, stop and SLA wake-up, as the live loop runs
            # one on every NOTIFY, and every ``period`` while jobs wait, as its timer does.
            now = max(now, math.ceil(nxt / self.tick) * self.tick if self.tick > 0 else nxt)
            while ai < len(arrivals) and arrivals[ai][0] <= now:
                self._submit(arrivals[ai][1], now)
                ai += 1
            plan_s.append(self._cycle(now))
            last_cycle = now
            busy = sum(self.jobs[j].sub.gpus for j in self.running)
            if series and series[-1][0] == now:
                series.pop()
            series.append((now, len(self.pending), busy))
        window = max((a[0] for a in arrivals), default=0.0)
        return self._result(name, now, window, plan_s, series)

    def _next_cycle(self, arrivals: list[tuple[float, int]], ai: int, last_cycle: float) -> float:
        """When the next cycle runs: the next arrival, event, or timer tick while jobs wait (inf: never)."""
        next_arrival = arrivals[ai][0] if ai < len(arrivals) else math.inf
        next_event = self.events[0][0] if self.events else math.inf
        # Nothing left to arrive, run, wake or resubmit: what still waits can never start (larger than the
        # cluster, or behind such a job's reservation), and the timer's cycles would change nothing.
        idle = ai >= len(arrivals) and not self.running and not self.events and not self.resubmitting
        periodic = last_cycle + self.period if self.pending and self.period > 0 and not idle else math.inf
        return min(next_arrival, next_event, periodic)

    def _cycle(self, now: float) -> float:
        """One cycle at ``now``: the events due, then ``plan()`` on the snapshot, its decisions applied; returns
        how long ``plan()`` took."""
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
        elapsed = time.perf_counter() - t0
        self._apply(decisions, now)
        return elapsed

    def _apply(self, decisions: Decisions, now: float) -> None:
        """The decisions as the live loop applies them: kills, starts, pending reasons, preemptions."""
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

    def _result(
        self, name: str, now: float, window: float, plan_s: list[float], series: list[tuple[float, int, int]]
    ) -> Result:
        finished = [j.finish for j in self.jobs.values() if j.finish is not None]
        makespan = max(finished, default=now)
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
            len(plan_s),
            plan_s,
            series,
            window,
            list(zip(self.used_gpu_s, self.borrowed_gpu_s, strict=True)),
            self.oracle,
            self.limits.name,
        )
