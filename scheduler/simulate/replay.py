"""Trace replay in simulated time, through the very same ``plan()`` as the live loop, against FIFO.

``python -m scheduler.simulate TRACE [--hosts N[,M...]] [--gpus-per-host 8] [--tick 300] [--jobs N] [--out DIR]``
(``TRACE`` = a Philly-format JSON file, or ``synthetic:N`` for a generated one.)

Model (stated, so the figures can be judged):

* each trace job gets a team and a QoS class from SHA-256 of its id: byte 0 picks the class (15% gold, 30% silver,
  30% bronze, 25% best-effort), byte 1 the team (``team0``..``team5``); max queue wait gold 30 min, silver 2 h,
  bronze 8 h, best-effort none;
* work = the trace's ``runtime`` (minutes of useful run time); every attempt but the last one of the trace failed:
  it holds its GPUs for its recorded duration, its work is lost, and the job is requeued at once;
* the scheduler knows each job's remaining useful run time (a perfect time-limit estimate) but not its failures;
* a cycle runs on every arrival, end and stop, and when a waiting job reaches half and 90% of its max queue
  wait (or its aging age): event-driven, as the live loop on NOTIFY (``--tick N`` rounds cycles up to N seconds);
* a preempted job checkpoints on SIGTERM (60 s: the trainer commits a checkpoint and exits 75) and stops, keeping
  its progress; those 60 s on its GPUs are counted as lost work (``preemption_lost_gpu_h``); the policy ranks
  victims by the work since their last periodic checkpoint (every 30 min); a requeued job's queue-wait SLA is not
  counted again;
* team quotas: each team's nominal is an even share of the GPUs, all six in one cohort, all of it lendable and
  borrowing unlimited, so an idle team's share is lent and reclaimed (``reclaim_preemptions``) when it needs it;
  ``teams`` reports GPU-hours used and borrowed (above nominal) per team;
* utilisation = busy GPU time / GPU time over the trace's submission window (both policies, same window);
  ``utilisation_to_makespan`` divides by each policy's own makespan instead;
* FIFO: submission order, the head blocks everyone behind it, no preemption, no backfill, no quotas. kiln: the
  policy the live loop runs, from the settings (``KILN_POLICY__*``; docs/configuration.md).
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
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import repeat
from pathlib import Path
from typing import Any

from core.policy_config import PolicyConfig
from core.settings import get_settings
from core.states import JobState
from scheduler.policy.plan import plan
from scheduler.policy.snapshot import ANY, HostInfo, PendingJob, PlacedHost, QuotaInfo, RunningJob, Snapshot, TeamInfo
from scheduler.simulate.synthetic import gpu_cluster

CLASSES = {"gold": (1000, False, 1800.0), "silver": (500, False, 7200.0), "bronze": (200, True, 28800.0),
           "best-effort": (0, True, None)}  # fmt: skip
TEAMS = 6
CHECKPOINT_S = 1800.0  # the trainers' checkpoint interval
STOP_S = 60.0  # SIGTERM -> checkpoint -> exit
HALF_LIFE_S = 7 * 86400.0
COHORT = "philly"


@dataclass(frozen=True)
class TraceJob:
    id: str
    gpus: int
    submit: float
    work: float  # useful seconds
    failures: tuple[float, ...]  # durations of failed attempts before the one that finished


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
    jobs = []
    for entry in raw:
        atts = entry.get("attempts") or []
        fails = []
        for a in atts[:-1]:
            try:
                fails.append(max(0.0, _parse_ts(a["end_time"]) - _parse_ts(a["start_time"])))
            except (KeyError, TypeError, ValueError):
                continue
        jobs.append(
            TraceJob(str(entry["id"]), int(entry["num_gpus"]), _parse_ts(entry["submitted_time"]),
                     float(entry["runtime"]) * 60.0, tuple(fails))
        )  # fmt: skip
    jobs.sort(key=lambda j: (j.submit, j.id))
    if limit:
        jobs = jobs[:limit]
    t0 = jobs[0].submit if jobs else 0.0
    return [replace(j, submit=j.submit - t0) for j in jobs]


def synthetic_trace(n: int, *, seed: int = 7, load_gpus: float = 48.0) -> list[TraceJob]:
    """Philly-like: 4/8 GPU jobs mostly, some 16/32, heavy-tailed run times, ~25% with a failed attempt."""
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
        fails = tuple(rng.uniform(60, work) for _ in range(1 if rng.random() < 0.25 else 0))
        out.append(TraceJob(f"synthetic_{i:05d}", rng.choice(sizes), t, max(600.0, work), fails))
    return out


@dataclass
class SimJob:
    trace: TraceJob
    qos: str
    team: int
    remaining_work: float
    failures: list[float]
    first_start: float | None = None
    finish: float | None = None
    started: float = 0.0
    segment: float = 0.0  # length of the current attempt (a failure's duration or the remaining work)
    failing: bool = False
    preempted: bool = False
    preemptions: int = 0  # times preempted so far (the snapshot's RunningJob.preemptions)
    placement: tuple[PlacedHost, ...] = ()
    miss_reason: str | None = None  # the pending reason it last had, when its first start broke its max wait


@dataclass
class Result:
    name: str
    jobs: list[SimJob]
    busy_gpu_s: float
    makespan: float
    gpus: int
    preemptions: int
    cycles: int
    plan_s: float
    series: list[tuple[float, int, int]] = field(default_factory=list)  # (t, queue length, busy GPUs)
    window: float = 0.0  # the trace's submission window: utilisation is measured over it, the same for both
    reclaims: int = 0  # preemptions that reclaimed lent quota (the rest: a higher class)
    lost_gpu_s: float = 0.0  # GPU time of preempted jobs spent checkpointing and stopping
    teams: list[tuple[float, float]] = field(default_factory=list)  # per team: (GPU-seconds used, borrowed)


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


def idle_and_tail_gpu_h(r: Result) -> tuple[float, float]:
    """GPU-hours idle while jobs were queued, and GPU-hours busy after the submission window: the two terms that
    separate two policies' window utilisation when they do the same work."""
    idle = tail = 0.0
    for (t, queued, busy), (t_next, _q, _b) in zip(r.series, [*r.series[1:], (r.makespan, 0, 0)], strict=True):
        span = max(0.0, t_next - t)
        if queued:
            idle += (r.gpus - busy) * span
        tail += busy * max(0.0, t_next - max(t, r.window)) if t_next > r.window else 0.0
    return idle / 3600, tail / 3600


class Simulation:
    def __init__(self, trace: Sequence[TraceJob], hosts: tuple[HostInfo, ...], config: PolicyConfig, tick: float):
        self.hosts = hosts
        self.gpus = sum(len(h.gpus) for h in hosts)
        self.config = config
        self.tick = tick
        # Team quotas: the cluster split evenly (the remainder to the first teams), all in one cohort, everything
        # lendable and borrowable: an idle team's share is lent, and reclaimed when that team needs it.
        self.nominal = [self.gpus // TEAMS + (1 if i < self.gpus % TEAMS else 0) for i in range(TEAMS)]
        self.borrowed_gpu_s = [0.0] * TEAMS
        self.used_gpu_s = [0.0] * TEAMS
        self.reclaims = 0
        self.lost_gpu_s = 0.0  # GPU time of preempted jobs between the request and the stop (no progress)
        self.jobs: dict[int, SimJob] = {}
        self.arrivals = []
        for i, tj in enumerate(trace, 1):
            qos, team = qos_and_team(tj.id)
            self.jobs[i] = SimJob(tj, qos, team, tj.work, list(tj.failures))
            self.arrivals.append((tj.submit, i))
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self.events: list[tuple[float, int, int, str]] = []  # (time, seq, job, kind)
        self.seq = 0
        self.usage = [0.0] * TEAMS
        self.usage_t = 0.0
        self.preemptions = 0
        self.busy_gpu_s = 0.0
        self.views: dict[int, tuple[RunningJob, RunningJob]] = {}  # running job -> its snapshot copy (checkpoint)

    def push(self, t: float, job: int, kind: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, job, kind))

    def _pending_job(self, jid: int, now: float) -> PendingJob:
        sj = self.jobs[jid]
        prio, pre, wait = CLASSES[sj.qos]
        gpus = sj.trace.gpus
        return PendingJob(
            id=jid, team_id=sj.team, qos=sj.qos, qos_priority=prio, preemptible=pre, gpus=gpus,
            submitted_at=sj.trace.submit, gpus_per_node=8 if gpus > 8 and gpus % 8 == 0 else None, quota_key=ANY,
            max_queue_wait_s=wait if sj.first_start is None else None, estimated_runtime_s=sj.remaining_work,
        )  # fmt: skip

    def _decay(self, now: float) -> None:
        dt = now - self.usage_t
        if dt <= 0:
            return
        f = 0.5 ** (dt / HALF_LIFE_S)
        per_team = [0] * TEAMS
        for r in self.running.values():
            per_team[r.team_id] += r.gpus
        self.usage = [u * f + per_team[i] * dt for i, u in enumerate(self.usage)]
        for i in range(TEAMS):
            self.used_gpu_s[i] += per_team[i] * dt
            self.borrowed_gpu_s[i] += max(0, per_team[i] - self.nominal[i]) * dt
        self.usage_t = now

    def _snapshot(self, now: float) -> Snapshot:
        running = []
        for jid, r in self.running.items():
            ckpt = r.started_at + math.floor((now - r.started_at) / CHECKPOINT_S) * CHECKPOINT_S
            seen = self.views.get(jid)
            if seen is None or seen[0] is not r or seen[1].last_checkpoint_at != ckpt:
                seen = self.views[jid] = (r, replace(r, last_checkpoint_at=ckpt))
            running.append(seen[1])
        teams = tuple(
            TeamInfo(i, f"team{i}", cohort=COHORT, quotas=(QuotaInfo(ANY, n),), decayed_usage=self.usage[i])
            for i, n in enumerate(self.nominal)
        )
        pending = tuple(self.pending.values())
        return Snapshot(now=now, hosts=self.hosts, running=tuple(running), pending=pending, teams=teams)

    def _start(self, jid: int, placement: tuple[PlacedHost, ...], now: float) -> None:
        sj = self.jobs[jid]
        waited = self.pending.pop(jid)
        if sj.first_start is None:
            sj.first_start = now
            max_wait = CLASSES[sj.qos][2]
            if max_wait is not None and now - sj.trace.submit > max_wait:
                sj.miss_reason = waited.pending_reason or "none"
        sj.started = now
        sj.failing = bool(sj.failures)
        sj.segment = sj.failures[0] if sj.failing else sj.remaining_work
        prio, pre, _ = CLASSES[sj.qos]
        self.running[jid] = RunningJob(
            id=jid, team_id=sj.team, qos=sj.qos, qos_priority=prio, preemptible=pre, gpus=sj.trace.gpus,
            gpu_type="H100", quota_key=ANY, placement=placement, started_at=now,
            expected_end=now + sj.remaining_work, preemptions=sj.preemptions,
        )  # fmt: skip
        self.push(now + sj.segment, jid, "end")

    def _stop(self, jid: int, now: float) -> SimJob:
        sj = self.jobs[jid]
        r = self.running.pop(jid)
        self.busy_gpu_s += r.gpus * (now - sj.started)
        return sj

    def _wakes(self, jid: int) -> None:
        """Cycles at the moments a waiting job's standing changes: at risk of its SLA, near breach, aged."""
        sj = self.jobs[jid]
        wait = CLASSES[sj.qos][2]
        submit = sj.trace.submit
        if wait is not None:
            for frac in (self.config.sla_reserve_fraction, 0.9):
                self.push(submit + frac * wait, jid, "wake")
        elif self.config.starvation_age_s is not None:
            self.push(submit + self.config.starvation_age_s, jid, "wake")

    def run(self, name: str) -> Result:
        arrivals = sorted(self.arrivals)
        ai = 0
        now = 0.0
        cycles = 0
        plan_s = 0.0
        series: list[tuple[float, int, int]] = []
        while ai < len(arrivals) or self.events or self.pending:
            while self.events and self.events[0][3] == "wake" and self.jobs[self.events[0][2]].first_start is not None:
                heapq.heappop(self.events)  # the job has started: nothing to wake for
            next_arrival = arrivals[ai][0] if ai < len(arrivals) else math.inf
            nxt = min(next_arrival, self.events[0][0] if self.events else math.inf)
            if nxt == math.inf:
                break  # pending jobs that can never run (larger than the cluster)
            # Event-driven (tick 0): a cycle at every arrival, end, stop and SLA wake-up, as the live loop runs
            # one on every NOTIFY. With a tick, cycles are rounded up to the next multiple of it.
            now = max(now, math.ceil(nxt / self.tick) * self.tick if self.tick > 0 else nxt)
            while ai < len(arrivals) and arrivals[ai][0] <= now:
                jid = arrivals[ai][1]
                self.pending[jid] = self._pending_job(jid, now)
                self._wakes(jid)
                ai += 1
            while self.events and self.events[0][0] <= now:
                t, _s, jid, kind = heapq.heappop(self.events)
                self._event(t, jid, kind)
            self._decay(now)
            t0 = time.perf_counter()
            decisions = plan(self._snapshot(now), self.config)
            plan_s += time.perf_counter() - t0
            cycles += 1
            for adm in decisions.admissions:
                place = tuple(PlacedHost(p.host, p.gpus) for p in adm.placement)
                self._start(adm.job_id, place, now)
            for w in decisions.pending:  # stored as the live loop's apply does: the next cycle sees it
                pj = self.pending.get(w.job_id)
                if pj is not None and pj.pending_reason != w.reason:
                    self.pending[w.job_id] = replace(pj, pending_reason=str(w.reason))
            for pre in decisions.preemptions:
                r = self.running[pre.job_id]
                self.running[pre.job_id] = replace(r, preempt_requested=True, state=JobState.PREEMPTING.value)
                self.jobs[pre.job_id].preempted = True
                self.jobs[pre.job_id].preemptions += 1
                self.preemptions += 1
                self.reclaims += "reclaimed" in pre.reason
                self.lost_gpu_s += r.gpus * STOP_S
                self.push(now + STOP_S, pre.job_id, "preempted")
            busy = sum(r.gpus for r in self.running.values())
            if series and series[-1][0] == now:
                series.pop()
            series.append((now, len(self.pending), busy))
        done = [j for j in self.jobs.values() if j.finish is not None]
        makespan = max((j.finish for j in done if j.finish is not None), default=now)
        window = max((a[0] for a in arrivals), default=0.0)
        return Result(name, list(self.jobs.values()), self.busy_gpu_s, makespan, self.gpus, self.preemptions,
                      cycles, plan_s, series, window, self.reclaims, self.lost_gpu_s,
                      list(zip(self.used_gpu_s, self.borrowed_gpu_s, strict=True)))  # fmt: skip

    def _event(self, t: float, jid: int, kind: str) -> None:
        sj = self.jobs[jid]
        if jid not in self.running:
            return
        if kind == "end":
            if self.running[jid].preempt_requested or abs(t - (sj.started + sj.segment)) > 1e-6:
                return  # superseded by a preemption
            self._stop(jid, t)
            if sj.failing:
                sj.failures.pop(0)  # a failed attempt: its work is lost; requeued at once
                self.pending[jid] = self._pending_job(jid, t)
            else:
                sj.finish = t
                sj.remaining_work = 0.0
        elif kind == "preempted":
            self._stop(jid, t)
            ran = max(0.0, t - STOP_S - sj.started)  # checkpointed when asked: progress kept
            if sj.failing:
                sj.failures[0] = max(0.0, sj.failures[0] - ran)
            else:
                sj.remaining_work = max(1.0, sj.remaining_work - ran)
            self.pending[jid] = self._pending_job(jid, t)


def summarize(r: Result) -> dict[str, Any]:
    done = [j for j in r.jobs if j.finish is not None and j.first_start is not None]
    jct = [j.finish - j.trace.submit for j in done]  # type: ignore[operator]
    wait = [j.first_start - j.trace.submit for j in done]  # type: ignore[operator]

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
        js = [j for j in done if j.qos == qos]
        met = sum(1 for j in js if max_wait is None or (j.first_start or 0.0) - j.trace.submit <= max_wait)
        sla[qos] = {"jobs": len(js), "attainment": round(met / len(js), 4) if js else 1.0,  # fmt: skip
                    "mean_wait_h": round(statistics.fmean([(j.first_start or 0) - j.trace.submit for j in js]) / 3600,
                                         3) if js else 0.0,
                    # what the jobs that broke their max wait were waiting with (the live loop's pending reasons)
                    "missed_by_reason": dict(sorted(Counter(j.miss_reason for j in js if j.miss_reason).items()))}
    return {
        "policy": r.name,
        "jobs_finished": len(done),
        "jobs_total": len(r.jobs),
        "jct": stats(jct),
        "queueing_delay": stats(wait),
        "utilisation": round(window_utilisation(r), 4),
        "utilisation_to_makespan": round(r.busy_gpu_s / (r.gpus * r.makespan), 4) if r.makespan else 0.0,
        "idle_while_queued_gpu_h": round(idle_and_tail_gpu_h(r)[0]),
        "gpu_h_after_window": round(idle_and_tail_gpu_h(r)[1]),
        "makespan_days": round(r.makespan / 86400, 2),
        "sla_attainment": sla,
        "preemptions": r.preemptions,
        "reclaim_preemptions": r.reclaims,
        "preemption_lost_gpu_h": round(r.lost_gpu_s / 3600, 1),
        "teams": [{"team": f"team{i}", "gpu_h": round(u / 3600), "borrowed_gpu_h": round(b / 3600)}
                  for i, (u, b) in enumerate(r.teams)],  # fmt: skip
        "cycles": r.cycles,
        "plan_ms_mean": round(1000 * r.plan_s / max(1, r.cycles), 3),
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
    head = "| policy | mean JCT h | p50 JCT h | p95 JCT h | mean wait h | p50 wait h | p95 wait h | util | " \
           "gold SLA | silver SLA | bronze SLA | preemptions (reclaim) | lost GPU-h |"  # fmt: skip
    lines = [head, "|" + "---|" * 13]
    for s in summaries:
        sla = s["sla_attainment"]
        lines.append(
            f"| {s['policy']} | {s['jct']['mean_h']} | {s['jct']['p50_h']} | {s['jct']['p95_h']} | "
            f"{s['queueing_delay']['mean_h']} | {s['queueing_delay']['p50_h']} | {s['queueing_delay']['p95_h']} | "
            f"{s['utilisation']:.1%} | {sla['gold']['attainment']:.1%} | {sla['silver']['attainment']:.1%} | "
            f"{sla['bronze']['attainment']:.1%} | {s['preemptions']} ({s['reclaim_preemptions']}) | "
            f"{s['preemption_lost_gpu_h']} |"
        )
    return "\n".join(lines)


def offered_load(trace: Sequence[TraceJob], gpus: int) -> float:
    """GPU time the trace asks for (work and failed attempts) over the GPU time of its submission window: above 1
    the cluster cannot keep up on average; below, a backlog exists only where the policy lets it build."""
    window = max((j.submit for j in trace), default=0.0)
    demand = sum(j.gpus * (j.work + sum(j.failures)) for j in trace)
    return demand / (gpus * window) if window > 0 and gpus else 0.0


FIFO = PolicyConfig(ordering="fifo", backfill=False, preemption=False, enforce_quotas=False)


def replay(
    trace: Sequence[TraceJob], hosts: int, gpus_per_host: int, tick: float, policy: PolicyConfig
) -> list[Result]:
    """FIFO and kiln (``policy``) over the same trace and cluster."""
    cluster = gpu_cluster(hosts, gpus_per_host)
    return [Simulation(trace, cluster, FIFO, tick).run("fifo"), Simulation(trace, cluster, policy, tick).run("kiln")]


def sweep_row(hosts: int, gpus: int, load: float, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"hosts": hosts, "gpus": gpus, "offered_load": round(load, 3)}
    for s in summaries:
        row[s["policy"]] = {"utilisation": s["utilisation"], "jct_mean_h": s["jct"]["mean_h"],
                            "gold_sla": s["sla_attainment"]["gold"]["attainment"],
                            "gold_missed_by_reason": s["sla_attainment"]["gold"]["missed_by_reason"],
                            "gpu_h_after_window": s["gpu_h_after_window"],
                            "idle_while_queued_gpu_h": s["idle_while_queued_gpu_h"]}  # fmt: skip
    return row


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| hosts (GPUs) | offered load | util FIFO / kiln | mean JCT h FIFO / kiln | gold SLA FIFO / kiln | "
             "GPU-h after window FIFO / kiln |", "|" + "---|" * 6]  # fmt: skip
    for r in rows:
        f, k = r["fifo"], r["kiln"]
        lines.append(
            f"| {r['hosts']} ({r['gpus']}) | {r['offered_load']:.2f} | "
            f"{f['utilisation']:.2%} / {k['utilisation']:.2%} | "
            f"{f['jct_mean_h']:.1f} / {k['jct_mean_h']:.1f} | {f['gold_sla']:.1%} / {k['gold_sla']:.1%} | "
            f"{f['gpu_h_after_window']:,} / {k['gpu_h_after_window']:,} |"
        )
    return "\n".join(lines)


def _hosts(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,M,...: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"host counts must be >= 1: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kiln simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="Philly-format JSON, or synthetic:N")
    ap.add_argument("--hosts", type=_hosts, default=[40],
                    help="hosts (default 40); a list (52,40,64) replays each size, in parallel: the table, JSON "
                         "results and plots are for the first, the sweep table for all")  # fmt: skip
    ap.add_argument("--gpus-per-host", type=int, default=8)
    ap.add_argument("--tick", type=float, default=0.0,
                    help="0: a cycle on every event (default); else cycles rounded up to multiples of this (s)")
    ap.add_argument("--jobs", type=int, default=None, help="replay only the first N jobs")
    ap.add_argument("--out", default="simulate-out")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    policy = get_settings().policy  # the live loop's policy: this process's entry reads it, plan() gets it
    trace = load_trace(args.trace, args.jobs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sizes: list[int] = args.hosts
    if len(sizes) == 1:
        by_size = [replay(trace, sizes[0], args.gpus_per_host, args.tick, policy)]
    else:
        with ProcessPoolExecutor(max_workers=min(len(sizes), os.cpu_count() or 1)) as pool:
            by_size = list(
                pool.map(replay, repeat(trace), sizes, repeat(args.gpus_per_host), repeat(args.tick), repeat(policy))
            )
    summaries_by_size = [[summarize(r) for r in rs] for rs in by_size]
    summaries = summaries_by_size[0]
    rows = [sweep_row(n, n * args.gpus_per_host, offered_load(trace, n * args.gpus_per_host), ss)
            for n, ss in zip(sizes, summaries_by_size, strict=True)]  # fmt: skip
    plots = [] if args.no_plots else plot(by_size[0], out)
    report = {
        "trace": args.trace,
        "jobs": len(trace),
        "gpus": sizes[0] * args.gpus_per_host,
        "hosts": sizes[0],
        "offered_load": rows[0]["offered_load"],
        "tick_s": args.tick,
        "policy": policy.model_dump(),
        "wall_s": round(time.perf_counter() - started, 1),
        "results": summaries,
        "sweep": rows,
        "plots": plots,
    }
    (out / "simulate.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(trace)} jobs on {sizes[0]} hosts x {args.gpus_per_host} GPUs (offered load "
          f"{rows[0]['offered_load']:.2f}); replay took {report['wall_s']} s")  # fmt: skip
    print(table(summaries))
    if len(sizes) > 1:
        print()
        print(sweep_table(rows))
    for p in plots:
        print("plot:", p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
