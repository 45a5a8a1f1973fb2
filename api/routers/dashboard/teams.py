"""Teams: quota used, borrowed and lent; GPU-hours against budget; fair share."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from api.deps import CurrentPrincipal, SessionDep
from api.routers.dashboard.common import (
    ACTIVE_STATES,
    visible_team_ids,
)
from core.db import utcnow
from core.models import (
    Job,
    Team,
    Usage,
)
from core.states import JobState

router = APIRouter(tags=["dashboard"])


def _used_by_team_type(session: Session) -> dict[tuple[int, str], int]:
    """GPUs (CPU slots for CPU jobs) held by active jobs, by team and the quota's resource name."""
    used: dict[tuple[int, str], int] = defaultdict(int)
    for team_id, gpus, gpu_type, spec in session.execute(
        select(Job.team_id, Job.gpus, Job.gpu_type, Job.spec).where(Job.state.in_(ACTIVE_STATES))
    ).tuples():
        if gpus:
            used[(team_id, gpu_type or "*")] += gpus
        else:
            used[(team_id, "cpu")] += int(((spec or {}).get("resources") or {}).get("cpu_slots", 1))
    return used


def _gpu_seconds_since(session: Session, since: datetime, now: datetime) -> dict[int, float]:
    """GPU-seconds per team within [since, now], counting only the part of each usage row inside the window."""
    out: dict[int, float] = defaultdict(float)
    rows = session.execute(
        select(Usage.team_id, Usage.gpu_seconds, Usage.started_at, Usage.ended_at).where(
            or_(Usage.ended_at.is_(None), Usage.ended_at >= since)
        )
    ).tuples()
    for team_id, secs, start, end in rows:
        end = end or now
        span = max((end - start).total_seconds(), 1e-9)
        inside = max(0.0, (min(end, now) - max(start, since)).total_seconds())
        out[team_id] += secs * min(1.0, inside / span)
    return out


FAIR_SHARE_HALF_LIFE_S = 7 * 86400


@router.get("/v1/dashboard/teams", summary="Quota used/borrowed/lent, GPU-hours against budget, fair share")
def teams_view(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    now = utcnow()
    visible = set(visible_team_ids(session, who))
    all_teams = list(session.scalars(select(Team).order_by(Team.name)))
    used = _used_by_team_type(session)

    # Borrowing and lending are cohort-wide: what borrowers take beyond their nominal quota is lent by the
    # cohort's teams with unused nominal quota, in proportion to what each can lend (its lending limit).
    quota_rows: list[dict[str, Any]] = []
    for t in all_teams:
        for q in t.quotas:
            u = used.get((t.id, q.gpu_type), 0)
            quota_rows.append({"team_id": t.id, "cohort": t.cohort or f"team:{t.id}", "gpu_type": q.gpu_type,
                               "nominal": q.nominal, "used": u, "borrowed": max(0, u - q.nominal),
                               "borrowing_limit": q.borrowing_limit, "lending_limit": q.lending_limit,
                               "lendable": min(max(0, q.nominal - u),
                                               q.lending_limit if q.lending_limit is not None else 10**9),
                               "lent": 0})  # fmt: skip
    by_pool: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in quota_rows:
        by_pool[(r["cohort"], r["gpu_type"])].append(r)
    for rows in by_pool.values():
        borrowed = sum(r["borrowed"] for r in rows)
        lendable = sum(r["lendable"] for r in rows)
        if borrowed and lendable:
            for r in rows:
                r["lent"] = round(min(r["lendable"], borrowed * r["lendable"] / lendable), 2)

    # Fair share: usage decayed with a 7-day half-life, as a share of all usage, against the weight's share.
    decay_since = now - timedelta(seconds=4 * FAIR_SHARE_HALF_LIFE_S)
    decayed: dict[int, float] = defaultdict(float)
    for team_id, secs, end in session.execute(
        select(Usage.team_id, Usage.gpu_seconds, Usage.ended_at).where(
            or_(Usage.ended_at.is_(None), Usage.ended_at >= decay_since)
        )
    ).tuples():
        age = (now - (end or now)).total_seconds()
        decayed[team_id] += secs * math.pow(0.5, age / FAIR_SHARE_HALF_LIFE_S)
    total_decayed = sum(decayed.values()) or 0.0
    total_weight = sum(t.fair_share_weight for t in all_teams) or 1.0

    out = []
    for t in all_teams:
        if t.id not in visible:
            continue
        period_start = now - timedelta(seconds=t.budget_period_s)
        gpu_hours = _gpu_seconds_since(session, period_start, now).get(t.id, 0.0) / 3600
        out.append(
            {
                "name": t.name,
                "cohort": t.cohort,
                "fair_share_weight": t.fair_share_weight,
                "weight_share": t.fair_share_weight / total_weight,
                "usage_share": (decayed.get(t.id, 0.0) / total_decayed) if total_decayed else 0.0,
                "gpu_hours": gpu_hours,
                "gpu_hour_budget": t.gpu_hour_budget,
                "budget_period_s": t.budget_period_s,
                "quotas": [
                    {
                        k: r[k]
                        for k in ("gpu_type", "nominal", "used", "borrowed", "lent", "borrowing_limit", "lending_limit")
                    }  # fmt: skip
                    for r in quota_rows
                    if r["team_id"] == t.id
                ],
                "waiting": session.scalar(
                    select(func.count(Job.id)).where(Job.team_id == t.id, Job.state == JobState.QUEUED)
                ),
                "active": session.scalar(
                    select(func.count(Job.id)).where(Job.team_id == t.id, Job.state.in_(ACTIVE_STATES))
                ),
            }
        )
    return {"teams": out, "fair_share_half_life_s": FAIR_SHARE_HALF_LIFE_S}
