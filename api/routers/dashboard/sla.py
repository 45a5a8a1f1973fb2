"""SLA attainment per team and QoS class over time, and the violations behind it."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import TeamQuery
from api.routers.dashboard.common import (
    effective_max_wait,
    iso,
    team_filter,
)
from core.db import utcnow
from core.models import (
    Event,
    Job,
    QosClass,
    Team,
)
from core.services.ops_metrics import is_violation_event
from core.states import JobState

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
    teams = team_filter(session, who, team)
    now = utcnow()
    since = now - timedelta(days=days)
    step = 3600 if bucket == "hour" else 86400
    qos_rows = {q.id: q for q in session.scalars(select(QosClass))}
    team_names = dict(session.execute(select(Team.id, Team.name).where(Team.id.in_(teams))).tuples().all())
    jobs = list(session.scalars(select(Job).where(Job.team_id.in_(teams), Job.submitted_at >= since)))
    max_waits = effective_max_wait(session, jobs, qos_rows)
    violation_events: dict[int, list[Event]] = defaultdict(list)
    for e in session.scalars(
        select(Event).where(Event.team_id.in_(teams), Event.created_at >= since, Event.type.like("SLA%"))
    ):
        if e.job_id is not None and is_violation_event(e.type):
            violation_events[e.job_id].append(e)

    start_epoch = int(since.timestamp()) // step * step
    series: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    violations = []
    for j in jobs:
        team_name = team_names.get(j.team_id, "?")
        qos_name = qos_rows[j.qos_class_id].name if j.qos_class_id in qos_rows else "?"
        waited = ((j.admitted_at or now) - j.submitted_at).total_seconds()
        limit = max_waits.get(j.id)
        reasons = []
        if limit is not None and waited > limit and (j.admitted_at is not None or j.state == JobState.QUEUED):
            reasons.append({"type": "QUEUE_WAIT", "message": f"waited {waited:.0f}s > {limit:.0f}s",
                            "at": iso(j.submitted_at + timedelta(seconds=limit))})  # fmt: skip
        for e in violation_events.get(j.id, []):
            reasons.append({"type": e.type, "message": e.message, "at": iso(e.created_at)})
        b = int(j.submitted_at.timestamp()) // step * step
        cell = series[(team_name, qos_name)][b]
        cell[0] += 1
        cell[1] += 0 if reasons else 1
        for r in reasons:
            violations.append({"job_id": j.id, "job": j.name, "team": team_name, "qos": qos_name, **r})
    out_series = []
    for (team_name, qos_name), cells in sorted(series.items()):
        points = [
            {"t": datetime.fromtimestamp(b, UTC).isoformat(), "jobs": c[0], "met": c[1], "attainment": c[1] / c[0]}
            for b, c in sorted(cells.items())
        ]
        jobs_n = sum(c[0] for c in cells.values())
        met_n = sum(c[1] for c in cells.values())
        out_series.append({"team": team_name, "qos": qos_name, "jobs": jobs_n, "met": met_n,
                           "attainment": met_n / jobs_n if jobs_n else None, "points": points})  # fmt: skip
    violations.sort(key=lambda v: v["at"] or "", reverse=True)
    return {
        "since": since.isoformat(),
        "bucket_s": step,
        "start": datetime.fromtimestamp(start_epoch, UTC).isoformat(),
        "series": out_series,
        "violations": violations[:500],
    }
