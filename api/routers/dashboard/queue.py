"""The index page, the signed-in context, prices, and the queue in scheduling order with positions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse
from pydantic import BaseModel

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.routers.common import QosQuery, TeamQuery, decode_cursor, encode_cursor
from api.routers.dashboard.common import FRONTEND_DIR, MAX_PAGE, iso, utc_iso
from core.db import utcnow
from core.models import Job
from core.queue_wait import queued_seconds
from core.services import dashboard
from core.services.dashboard import QueueSlice
from core.services.jobs import JobView
from core.states import JobState

router = APIRouter(tags=["dashboard"])


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(FRONTEND_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/v1/config/prices", summary="Price per GPU-hour by GPU type (KILN_GPU_PRICES)")
def prices(who: CurrentPrincipal, settings: SettingsDep) -> dict[str, Any]:
    return {"currency": settings.currency, "prices": settings.gpu_prices, "unit": "per GPU-hour (cpu: per slot-hour)"}


@router.get("/v1/dashboard/context", summary="Who is signed in, their teams and the QoS classes")
def context(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    roles = who.roles
    teams = dashboard.visible_teams(session, who)
    return {
        "user": {"name": who.name, "is_admin": who.is_admin},
        "teams": [
            {"name": t.name, "role": roles.get(t.id, "admin"), "qos_classes": [q.name for q in t.qos_classes]}
            for t in teams
        ],
        "qos_classes": [
            {
                "name": q.name,
                "priority": q.priority,
                "preemptible": q.preemptible,
                "default_max_queue_wait_s": q.default_max_queue_wait_s,
                "description": q.description,
            }
            for q in dashboard.qos_classes(session)
        ],
    }


class QueueRow(BaseModel):
    id: int
    name: str
    team: str
    qos: str
    state: str
    position: int | None
    gpus: int
    gpu_type: str | None
    pending_reason: str | None
    pending_message: str | None
    submitted_at: str
    started_at: str | None
    finished_at: str | None
    wait_s: float
    max_wait_s: float | None
    last_step: int
    steps: int | None
    last_loss: float | None
    restart_count: int
    exit_reason: str | None  # why a finished job ended (kiln ls's REASON): a failure's own line, a cancel's reason


class QueuePage(BaseModel):
    items: list[QueueRow]
    next_cursor: str | None
    total: int


@router.get("/v1/dashboard/queue", response_model=QueuePage, summary="Jobs in queue order, with position")
def queue(
    session: SessionDep,
    who: CurrentPrincipal,
    view: Annotated[str, Query(pattern="^(waiting|active|finished)$")] = "waiting",
    team: TeamQuery = None,
    qos: QosQuery = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    submitted_after: Annotated[
        datetime | None, Query(description="Only jobs submitted at or after this time (RFC 3339; no zone: UTC)")
    ] = None,
) -> QueuePage:
    """``waiting``: QUEUED jobs in the scheduler's base order (QoS priority, job priority, submission), with the
    position in the whole queue; ``active``: admitted/running/preempting/paused; ``finished``: newest first.
    Keyset pagination: ``next_cursor`` holds the last row's sort key."""
    after = decode_cursor(cursor, "pos" if view == "waiting" else "id") if cursor else None
    page = dashboard.queue_page(
        session, who, view=view, team=team, qos=qos, after=after, limit=limit, submitted_after=submitted_after
    )
    now = utcnow()
    items = [_waiting_row(j, pos, page, now) for j, pos in page.waiting]
    items += [_listed_row(v, page, now, finished=view == "finished") for v in page.listed]
    next_cursor = None
    if page.more and page.waiting:
        last_job, last_pos = page.waiting[-1]
        next_cursor = encode_cursor("pos", last_pos) if last_pos else encode_cursor("id", last_job.id)
    elif page.more and page.listed:
        next_cursor = encode_cursor("id", page.listed[-1].id)
    return QueuePage(items=items, next_cursor=next_cursor, total=page.total)


def _waiting_row(j: Job, pos: int, page: QueueSlice, now: datetime) -> QueueRow:
    """A QUEUED job of the queue-order read (an ORM row)."""
    qos_row = page.qos_by_id.get(j.qos_class_id)
    return QueueRow(
        id=j.id,
        name=j.name,
        team=page.team_names.get(j.team_id, str(j.team_id)),
        qos=qos_row.name if qos_row else "?",
        state=j.state,
        position=None if j.held_at is not None else pos,  # held: not in the line (it sorts last)
        gpus=j.gpus,
        gpu_type=j.gpu_type,
        pending_reason=j.pending_reason,
        pending_message=j.pending_message,
        submitted_at=j.submitted_at.isoformat(),
        started_at=iso(j.started_at),
        finished_at=iso(j.finished_at),
        wait_s=queued_seconds(j, now),
        max_wait_s=page.max_waits.get(j.id),
        last_step=j.last_step,
        steps=(j.spec or {}).get("steps"),
        last_loss=j.last_loss,
        restart_count=j.restart_count,
        exit_reason=None,
    )


def _listed_row(v: JobView, page: QueueSlice, now: datetime, *, finished: bool) -> QueueRow:
    """An active or finished job of the job list ``/v1/jobs`` answers (its times may be in the session's zone)."""
    waited = (v.queued_s or 0.0) + (max(0.0, (now - v.waiting_since).total_seconds()) if v.waiting_since else 0.0)
    return QueueRow(
        id=v.id,
        name=v.name,
        team=v.team,
        qos=v.qos,
        state=v.state,
        position=None,
        gpus=v.gpus,
        gpu_type=v.gpu_type,
        pending_reason=v.pending_reason,
        pending_message=v.pending_message,
        submitted_at=v.submitted_at.astimezone(UTC).isoformat(),
        started_at=utc_iso(v.started_at),
        finished_at=utc_iso(v.finished_at),
        wait_s=waited,
        max_wait_s=page.max_waits.get(v.id),
        last_step=v.last_step,
        steps=v.steps,
        last_loss=v.last_loss,
        restart_count=v.restart_count,
        exit_reason=v.exit_reason if finished else None,
    )


@router.get("/v1/dashboard/queue/summary", summary="Jobs waiting and running, by team and QoS class")
def queue_summary(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    rows, reasons = dashboard.queue_groups(session, who)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    now = utcnow()
    for team, qos, state, count, gpus, oldest in rows:
        g = groups.setdefault(
            (team, qos),
            {
                "team": team,
                "qos": qos,
                "waiting": 0,
                "active": 0,
                "gpus_waiting": 0,
                "gpus_active": 0,
                "oldest_wait_s": None,
            },
        )
        if state == JobState.QUEUED:
            g["waiting"] += count
            g["gpus_waiting"] += int(gpus or 0)
            if oldest is not None:
                g["oldest_wait_s"] = (now - oldest).total_seconds()
        else:
            g["active"] += count
            g["gpus_active"] += int(gpus or 0)
    return {
        "groups": sorted(groups.values(), key=lambda g: (g["team"], g["qos"])),
        "pending_reasons": {(r or "NONE"): c for r, c in reasons},
    }
