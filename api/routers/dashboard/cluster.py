"""Cluster (hosts and GPUs) and cost (GPU-hours x price per GPU type) over time."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.routers.dashboard.common import epoch_iso, iso
from core.db import utcnow
from core.services import capacity, compile_cache, forecasts
from core.states import HostState

router = APIRouter(tags=["dashboard"])


@router.get("/v1/dashboard/cluster", summary="Hosts, GPUs with their last samples, jobs on each host")
def cluster(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    """Hosts are shared infrastructure: everyone signed in sees them; job names only for visible teams."""
    hosts, running = capacity.hosts_with_jobs(session, who)
    now = utcnow()
    return {
        "hosts": [
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
                    }
                    for g in h.gpus
                ],
                "jobs": running.get(h.name, []),
            }
            for h in hosts
        ]
    }


@router.get("/v1/dashboard/cost", summary="GPU-hours and cost per team over time")
def cost(
    session: SessionDep,
    who: CurrentPrincipal,
    settings: SettingsDep,
    days: Annotated[int, Query(ge=1, le=366)] = 30,
    bucket: Annotated[str, Query(pattern="^(hour|day)$")] = "day",
) -> dict[str, Any]:
    """Each usage row's GPU-seconds are spread evenly over its time span and cut into buckets; ``compile_cache``:
    each team's compile-cache reuse over the same days (teams that compiled in them); ``forecasts``: how far the
    forecasts made for the visible teams' jobs in those days were from what happened (as ``GET /v1/usage``)."""
    now = utcnow()
    since = now - timedelta(days=days)
    step = 3600 if bucket == "hour" else 86400
    teams = capacity.cost_by_team(session, who, prices=settings.gpu_prices, now=now, since=since, step_s=step)
    series = [
        {
            "team": t.team,
            "gpu_hours": t.gpu_hours,
            "cost": t.cost,
            "by_gpu_type": t.by_gpu_type,
            "points": [{"t": epoch_iso(b), "gpu_hours": hours, "cost": cost} for b, hours, cost in t.points],
        }
        for t in teams
    ]
    return {
        "currency": settings.currency,
        "prices": settings.gpu_prices,
        "start": epoch_iso(int(since.timestamp()) // step * step),
        "bucket_s": step,
        "series": series,
        "compile_cache": [
            {
                "team": r.team,
                "compiled": r.compiled,
                "hits": r.hits,
                "hit_rate": r.hit_rate,
                "saved_s": r.saved_s,
                "rejected": r.rejected,
            }
            for r in compile_cache.visible_by_team(session, principal=who, since=since, until=now)
        ],
        "forecasts": [asdict(e) for e in forecasts.visible_summary(session, principal=who, since=since, until=now)],
    }
