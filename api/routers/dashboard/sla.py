"""SLA attainment per team and QoS class over time, and the violations behind it."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import TeamQuery
from api.routers.dashboard.common import epoch_iso
from core.db import utcnow
from core.services import dashboard

router = APIRouter(tags=["dashboard"])


@router.get("/v1/sla/attainment", summary="SLA attainment per team and QoS class over time, and violations")
def sla_attainment(
    session: SessionDep,
    who: CurrentPrincipal,
    days: Annotated[int, Query(ge=1, le=90)] = 7,
    bucket: Annotated[str, Query(pattern="^(hour|day)$")] = "day",
    team: TeamQuery = None,
) -> dict[str, Any]:
    """A job attains its SLA unless it waited longer than its contract's maximum queue wait or the SLA
    evaluator recorded a violation event (``SLA_*VIOLATION*``) on it. Jobs are bucketed by submission time."""
    now = utcnow()
    since = now - timedelta(days=days)
    step = 3600 if bucket == "hour" else 86400
    jobs = dashboard.sla_of_jobs_since(session, who, team=team, since=since, now=now)

    start_epoch = int(since.timestamp()) // step * step
    series: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    violations = []
    for js in jobs:
        b = int(js.job.submitted_at.timestamp()) // step * step
        cell = series[(js.team, js.qos)][b]
        cell[0] += 1
        cell[1] += 0 if js.reasons else 1
        cell[2] += 1 if js.unmeasured else 0
        for r in js.reasons:
            violations.append({"job_id": js.job.id, "job": js.job.name, "team": js.team, "qos": js.qos, **r})
    out_series = []
    for (team_name, qos_name), cells in sorted(series.items()):
        points = [
            {"t": epoch_iso(b), "jobs": c[0], "met": c[1], "attainment": c[1] / c[0]} for b, c in sorted(cells.items())
        ]
        jobs_n = sum(c[0] for c in cells.values())
        met_n = sum(c[1] for c in cells.values())
        # jobs that ran and whose pace was never compared: their step-time term was never measured (met counts them only
        # for the terms that were)
        unmeasured_n = sum(c[2] for c in cells.values())
        out_series.append(
            {
                "team": team_name,
                "qos": qos_name,
                "jobs": jobs_n,
                "met": met_n,
                "step_time_unmeasured": unmeasured_n,
                "attainment": met_n / jobs_n if jobs_n else None,
                "points": points,
            }
        )
    violations.sort(key=lambda v: v["at"] or "", reverse=True)
    return {
        "since": since.isoformat(),
        "bucket_s": step,
        "start": epoch_iso(start_epoch),
        "series": out_series,
        "violations": violations[:500],
    }
