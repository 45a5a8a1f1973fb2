"""Database rows -> ``Snapshot``. Datetimes become POSIX seconds here; nothing below this module sees the DB."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from core.models import Attempt, Job, QosClass, SlaContract, Team, Usage
from core.policy_config import PolicyConfig
from core.repositories import jobs as jobs_repo
from core.services.fit import share_of
from core.spec import runs_team_code
from core.states import HostState, MpsState
from scheduler.live import repository as repo
from scheduler.policy.snapshot import (
    CPU,
    GpuInfo,
    GpuShare,
    HostInfo,
    PendingJob,
    PlacedHost,
    QuotaInfo,
    RunningJob,
    Snapshot,
    TeamInfo,
    quota_key_for,
)

HISTORY_PER_TEAM = 200  # finished jobs per team the policy learns run times from (scheduler.estimate)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _resources(job: Job) -> dict[str, Any]:
    res = (job.spec or {}).get("resources") or {}
    return res if isinstance(res, dict) else {}


def bandwidth_of(qos: QosClass | None) -> tuple[tuple[str, float], ...]:
    if qos is None:
        return ()
    out: list[tuple[str, float]] = []
    if qos.pcie_bandwidth_bytes_per_s:
        out.append(("pcie", float(qos.pcie_bandwidth_bytes_per_s)))
    if qos.nvlink_bandwidth_bytes_per_s:
        out.append(("nvlink", float(qos.nvlink_bandwidth_bytes_per_s)))
    return tuple(out)


def decayed(usage: Usage, now: float, half_life_s: float) -> float:
    """GPU-seconds of one usage record, each second weighted 2^-(age / half-life): a closed-form integral."""
    start = usage.started_at.timestamp()
    end = usage.ended_at.timestamp() if usage.ended_at is not None else now
    end = min(end, now)
    if end <= start:
        return 0.0
    k = math.log(2) / half_life_s
    return usage.gpus * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k


def period_start(team: Team, now: float) -> float:
    origin = team.created_at.timestamp()
    period = max(1, team.budget_period_s)
    return origin + math.floor(max(0.0, now - origin) / period) * period


def _hosts(db: Session, now: datetime) -> tuple[HostInfo, ...]:
    out = []
    for h in repo.hosts(db):
        excluded = h.state != HostState.UP or (h.excluded_until is not None and h.excluded_until > now)
        links = tuple(sorted((str(k), float(v)) for k, v in (h.links or {}).items() if isinstance(v, (int, float))))
        gpus = tuple(
            GpuInfo(
                uuid=g.uuid,
                index=g.index,
                model=g.model,
                memory_bytes=g.memory_bytes,
                nvlink_peers=tuple(str(p) for p in (g.nvlink_peers or [])),
                healthy=g.healthy and not g.mig_mode,
            )
            for g in h.gpus
        )
        sandboxes = h.isolation in ("sandbox", "none")  # workers.isolation; NULL: not said yet
        out.append(
            HostInfo(
                h.name,
                h.queue,
                gpus,
                h.cpu_slots,
                links,
                excluded,
                mps=h.mps == MpsState.RUNNING,
                runs_team_code=sandboxes,
            )
        )
    return tuple(out)


def _history(db: Session) -> dict[int, tuple[tuple[float, ...], float | None]]:
    """Per team: its finished jobs' run times (ascending) and the median share of their time limits they used."""
    out: dict[int, tuple[tuple[float, ...], float | None]] = {}
    for team_id, rows in repo.finished_history(db, HISTORY_PER_TEAM).items():
        ratios = sorted(ran / limit for ran, limit in rows if limit)
        out[team_id] = (tuple(sorted(ran for ran, _ in rows)), ratios[len(ratios) // 2] if ratios else None)
    return out


def _teams(db: Session, now: float, half_life_s: float) -> tuple[TeamInfo, ...]:
    rows = repo.teams(db)
    history = _history(db)
    since = repo.horizon(datetime.fromtimestamp(now).astimezone(), half_life_s, rows)
    usage: dict[int, float] = {}
    used_hours: dict[int, float] = {}
    starts = {t.id: period_start(t, now) for t in rows}
    for u in repo.usage_since(db, since):
        usage[u.team_id] = usage.get(u.team_id, 0.0) + decayed(u, now, half_life_s)
        start = max(u.started_at.timestamp(), starts.get(u.team_id, now))
        end = min(u.ended_at.timestamp() if u.ended_at is not None else now, now)
        if end > start:
            used_hours[u.team_id] = used_hours.get(u.team_id, 0.0) + u.gpus * (end - start) / 3600.0
    return tuple(
        TeamInfo(
            id=t.id,
            name=t.name,
            cohort=t.cohort,
            weight=t.fair_share_weight,
            quotas=tuple(
                QuotaInfo(q.gpu_type, q.nominal, q.borrowing_limit, q.lending_limit)
                for q in sorted(t.quotas, key=lambda q: q.gpu_type)
            ),
            decayed_usage=usage.get(t.id, 0.0),
            budget_gpu_hours=t.gpu_hour_budget,
            used_gpu_hours=used_hours.get(t.id, 0.0),
            finished_runtimes_s=history.get(t.id, ((), None))[0],
            limit_use_ratio=history.get(t.id, ((), None))[1],
        )
        for t in rows
    )


def _running(
    db: Session,
    hosts: tuple[HostInfo, ...],
    teams: dict[int, TeamInfo],
    qos: dict[int, QosClass],
) -> tuple[RunningJob, ...]:
    model_of = {g.uuid: g.model for h in hosts for g in h.gpus}
    rows = [(j, a) for j, a in jobs_repo.active_jobs(db) if a is not None and a.ended_at is None]
    ckpts = repo.last_checkpoints(db, [j.id for j, _ in rows])
    preempted = repo.preemption_counts(db, [j.id for j, _ in rows])
    attained = repo.attained_seconds(db, [j.id for j, a in rows if a.number > 1])  # restarted, preempted or held
    return tuple(
        replace(
            _running_job(job, attempt, teams, qos, model_of, ckpts.get(job.id), preempted.get(job.id, 0)),
            attained_s=attained.get(job.id, 0.0),
        )
        for job, attempt in rows
    )


def _running_job(
    job: Job,
    attempt: Attempt,
    teams: dict[int, TeamInfo],
    qos: dict[int, QosClass],
    model_of: dict[str, str],
    ckpt: tuple[int, datetime] | None,
    preemptions: int,
) -> RunningJob:
    placement = tuple(
        PlacedHost(
            host=str(p.get("host")),
            gpus=tuple(str(g) for g in p.get("gpus") or ()),
            slots=int(p.get("slots") or 0),
        )
        for p in (attempt.placement or [])
        if isinstance(p, dict)
    )
    q = qos.get(job.qos_class_id)
    started = attempt.started_at or attempt.created_at
    limit = job.time_limit_s
    if job.gpus:
        first = next((g for p in placement for g in p.gpus), None)
        gpu_type = model_of.get(first, job.gpu_type or "") if first else (job.gpu_type or "")
        units = job.gpus
    else:
        gpu_type = CPU
        units = sum(p.slots for p in placement) or int(_resources(job).get("cpu_slots") or 1)
    return RunningJob(
        share=next(
            (_placed_share(p) for p in (attempt.placement or []) if isinstance(p, dict) and p.get("share")), None
        ),
        id=job.id,
        team_id=job.team_id,
        qos=q.name if q else "",
        qos_priority=q.priority if q else 0,
        preemptible=bool(q and q.preemptible),
        gpus=units,
        gpu_type=gpu_type,
        quota_key=quota_key_for(teams.get(job.team_id), job.gpus, job.gpu_type, gpu_type),
        placement=placement,
        started_at=started.timestamp(),
        last_checkpoint_at=_ts(ckpt[1]) if ckpt else None,
        last_checkpoint_step=ckpt[0] if ckpt else 0,
        bandwidth=bandwidth_of(q),
        expected_end=started.timestamp() + limit if limit is not None else None,
        time_limit_s=limit,
        preempt_requested=job.preempt_requested,
        state=job.state,
        preemptions=preemptions,
        sweep_id=job.sweep_id,
    )


def _pending(
    db: Session,
    teams: dict[int, TeamInfo],
    qos: dict[int, QosClass],
    defaults: dict[int, SlaContract],
) -> tuple[PendingJob, ...]:
    rows = repo.queued_jobs(db)
    ids = [j.id for j, _ in rows]
    deps = repo.dependencies(db, ids)
    lost_on = repo.lost_on_hosts(db, [j.id for j, _ in rows if j.restart_count > 0])
    sweep_limits = repo.sweep_limits(db, {j.sweep_id for j, _ in rows if j.sweep_id is not None})
    attained = repo.attained_seconds(db, [j.id for j, _ in rows if j.admitted_at is not None])
    out = []
    for job, own in rows:
        contract = own or defaults.get(job.team_id)
        q = qos.get(job.qos_class_id)
        sla = (job.spec or {}).get("sla") or {}
        max_wait = contract.max_queue_wait_s if contract and contract.max_queue_wait_s else None
        if max_wait is None and q is not None:
            max_wait = q.default_max_queue_wait_s
        if max_wait is not None:
            max_wait = max(0.0, max_wait - (job.queued_s or 0.0))  # what its earlier waits left of the budget
        deadline = contract.deadline if contract and contract.deadline else None
        if deadline is None and isinstance(sla, dict) and sla.get("deadline"):
            try:
                deadline = datetime.fromisoformat(str(sla["deadline"]))
            except ValueError:
                deadline = None
        out.append(
            pending_job(
                job_id=job.id,
                team_id=job.team_id,
                team=teams.get(job.team_id),
                q=q,
                spec=job.spec or {},
                gpus=job.gpus,
                gpu_type=job.gpu_type,
                # the backlog bound and aging count the time the job could have started: a hold's time is left out
                # (Slurm's accrue time), so a released job does not jump the queue by the time it was held
                submitted_at=job.submitted_at.timestamp() + (job.held_s or 0.0),
                priority=job.priority,
                max_queue_wait_s=max_wait,
                deadline=_ts(deadline),
                estimated_runtime_s=job.time_limit_s,
                memory_bytes=job.predicted_memory_bytes,
                depends_on=tuple(deps.get(job.id, ())),
                not_before=_ts(job.not_before),
                pending_reason=job.pending_reason,
                avoid_hosts=lost_on.get(job.id, frozenset()),
                sweep_id=job.sweep_id,
                sweep_limit=sweep_limits.get(job.sweep_id) if job.sweep_id is not None else None,
                attained_s=attained.get(job.id, 0.0),
                wait_started_at=_ts(job.wait_started_at),
            )
        )
    return tuple(out)


def pending_job(
    *,
    job_id: int,
    team_id: int,
    team: TeamInfo | None,
    q: QosClass | None,
    spec: dict[str, Any],
    gpus: int,
    gpu_type: str | None,
    **terms: Any,
) -> PendingJob:
    """A queued job as the policy sees it: what its spec and class decide, the same for a job in the queue and for
    one ``kiln estimate`` would submit (``scheduler.live.forecast``); ``terms`` are the rest of its fields (its
    submission time, priority, SLA terms and queue history), which the two know differently."""
    res = spec.get("resources") or {}
    res = res if isinstance(res, dict) else {}
    per_node = res.get("gpus_per_node")
    share = requested_share(res, q)
    return PendingJob(
        id=job_id,
        team_id=team_id,
        qos=q.name if q else "",
        qos_priority=q.priority if q else 0,
        preemptible=bool(q and q.preemptible),
        gpus=gpus,
        gpus_per_node=int(per_node) if isinstance(per_node, int) else None,
        gpu_type=gpu_type,
        cpu_slots=int(res.get("cpu_slots") or 1),
        quota_key=quota_key_for(team, gpus, gpu_type),
        memory_cap_bytes=share.memory_bytes if share is not None else (q.gpu_memory_cap_bytes if q else None),
        bandwidth=bandwidth_of(q),
        share=share,
        team_code=runs_team_code(spec),
        **terms,
    )


def requested_share(resources: dict[str, Any], qos: QosClass | None) -> GpuShare | None:
    """A fractional job's share, what its spec leaves out taken from its class (``core.services.fit.share_of``)."""
    resolved = share_of(
        resources.get("gpu_share"), qos.gpu_memory_cap_bytes if qos else None, qos.sm_percent if qos else 100
    )
    if resolved is None:
        return None
    memory, sm = resolved
    return GpuShare(memory_bytes=memory or 0, sm_percent=sm, guaranteed=not (qos and qos.preemptible))


def _placed_share(node: dict[str, Any]) -> GpuShare:
    share = node["share"]
    return GpuShare(int(share["memory_bytes"]), int(share["sm_percent"]), bool(share["guaranteed"]))


def load_snapshot(*, db: Session, now: datetime, half_life_s: float = PolicyConfig().fairshare_half_life_s) -> Snapshot:
    t = now.timestamp()
    hosts = _hosts(db, now)
    team_infos = _teams(db, t, half_life_s)
    teams = {ti.id: ti for ti in team_infos}
    qos = repo.qos_classes(db)
    defaults = repo.team_default_contracts(db)
    running = _running(db, hosts, teams, qos)
    pending = _pending(db, teams, qos, defaults)
    return Snapshot(now=t, hosts=hosts, running=running, pending=pending, teams=team_infos)
