"""Cluster (hosts and GPUs) and cost (GPU-hours x price per GPU type) over time."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import or_, select

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.routers.dashboard.common import (
    ACTIVE_STATES,
    iso,
    price_for,
    visible_team_ids,
)
from core.db import utcnow
from core.models import (
    Attempt,
    Host,
    Job,
    Team,
    Usage,
)
from core.states import HostState

router = APIRouter(tags=["dashboard"])


@router.get("/v1/dashboard/cluster", summary="Hosts, GPUs with their last samples, jobs on each host")
def cluster(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    """Hosts are shared infrastructure: everyone signed in sees them; job names only for visible teams."""
    visible = set(visible_team_ids(session, who))
    running: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a, job in session.execute(
        select(Attempt, Job)
        .join(Job, Job.id == Attempt.job_id)
        .where(Job.state.in_(ACTIVE_STATES), Attempt.fencing_token == Job.fencing_token)
    ).tuples():
        for p in a.placement or []:
            host = p.get("host") if isinstance(p, dict) else None
            if host:
                running[host].append({"job_id": job.id if job.team_id in visible else None,
                                      "name": job.name if job.team_id in visible else "(other team)",
                                      "gpus": len(p.get("gpus") or []), "slots": p.get("slots")})  # fmt: skip
    now = utcnow()
    hosts = []
    for h in session.scalars(select(Host).order_by(Host.name)):
        hosts.append(
            {
                "name": h.name,
                "state": h.state,
                "cpu_slots": h.cpu_slots,
                "excluded_until": iso(h.excluded_until),
                "exclusion_reason": h.exclusion_reason,
                "excluded": h.state == HostState.EXCLUDED or (h.excluded_until is not None and h.excluded_until > now),
                "last_heartbeat_at": iso(h.last_heartbeat_at),
                "heartbeat_age_s": (now - h.last_heartbeat_at).total_seconds() if h.last_heartbeat_at else None,
                "links": h.links,
                "gpus": [
                    {
                        "uuid": g.uuid,
                        "index": g.index,
                        "model": g.model,
                        "memory_bytes": g.memory_bytes,
                        "healthy": g.healthy,
                        "mig_mode": g.mig_mode,
                        "sample": g.last_sample,
                    }  # fmt: skip
                    for g in h.gpus
                ],
                "jobs": running.get(h.name, []),
            }
        )
    return {"hosts": hosts}


@router.get("/v1/dashboard/cost", summary="GPU-hours and cost per team over time")
def cost(
    session: SessionDep,
    who: CurrentPrincipal,
    settings: SettingsDep,
    days: Annotated[int, Query(ge=1, le=366)] = 30,
    bucket: Annotated[str, Query(pattern="^(hour|day)$")] = "day",
) -> dict[str, Any]:
    """Each usage row's GPU-seconds are spread evenly over its time span and cut into buckets."""
    teams = visible_team_ids(session, who)
    team_names = dict(session.execute(select(Team.id, Team.name).where(Team.id.in_(teams))).tuples().all())
    now = utcnow()
    since = now - timedelta(days=days)
    step = 3600 if bucket == "hour" else 86400
    first = int(since.timestamp()) // step * step
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    by_type: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = session.execute(
        select(Usage.team_id, Usage.gpu_type, Usage.gpu_seconds, Usage.started_at, Usage.ended_at).where(
            Usage.team_id.in_(teams), or_(Usage.ended_at.is_(None), Usage.ended_at >= since)
        )
    ).tuples()
    for team_id, gpu_type, secs, start, end in rows:
        end = end or now
        t0, t1 = max(start, since).timestamp(), min(end, now).timestamp()
        span = max((end - start).total_seconds(), 1e-9)
        price = price_for(settings.gpu_prices, gpu_type)
        name = team_names.get(team_id, "?")
        b = int(t0) // step * step
        while b < t1:
            inside = max(0.0, min(t1, b + step) - max(t0, b))
            share = secs * min(1.0, inside / span) / 3600 if span > 0 else 0.0
            if share:
                cells[name][b][0] += share
                cells[name][b][1] += share * price
                by_type[name][gpu_type] += share
            b += step
    series = []
    for name in sorted(cells):
        buckets = sorted(cells[name].items())
        points = [
            {"t": datetime.fromtimestamp(b, UTC).isoformat(), "gpu_hours": v[0], "cost": v[1]} for b, v in buckets
        ]
        series.append({"team": name, "gpu_hours": sum(v[0] for _, v in buckets), "cost": sum(v[1] for _, v in buckets),
                       "by_gpu_type": dict(by_type[name]), "points": points})  # fmt: skip
    return {
        "currency": settings.currency,
        "prices": settings.gpu_prices,
        "start": datetime.fromtimestamp(first, UTC).isoformat(),
        "bucket_s": step,
        "series": series,
    }
