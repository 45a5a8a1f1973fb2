"""The web dashboard: static files under ``frontend/`` served at ``/``, and the read-only views it needs.

No Node build step: ``frontend/`` is plain HTML, ES modules and CSS, mounted as it is (see docs/dashboard.md).

Install on the app with one line in ``api/app.py``::

    dashboard.install(app)

The endpoints here are aggregate, read-only queries over the models that the domain routers do not offer
(queue order and position, quota usage, SLA attainment, cost, one-request job overview). They respect tenancy
like the rest of the API: a member sees only their teams, an admin sees all, another team's job answers 404.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from api.deps import CurrentPrincipal, SessionDep, StreamPrincipal
from core.db import utcnow
from core.models import (
    Attempt,
    Checkpoint,
    Event,
    Host,
    Job,
    JobMetric,
    QosClass,
    SlaContract,
    Team,
    Usage,
)
from core.services.errors import InvalidInput, NotFound
from core.services.ops_metrics import is_violation_event
from core.services.principal import Principal

FRONTEND_DIR = Path(__file__).resolve().parents[2] / "frontend"

ACTIVE_STATES = ("ADMITTED", "RUNNING", "PREEMPTING", "PAUSED")
FINISHED_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")  # terminal; LOST is requeued by the reconciler
MAX_PAGE = 200


# ---------------------------------------------------------------------------------------------------------------
# Configuration: price per GPU-hour per GPU type


class DashboardSettings(BaseSettings):
    """``KILN_GPU_PRICES``: JSON object, price per GPU-hour (CPU slot-hour for ``cpu``) by GPU type.

    ``*`` is the price of a type not listed. Currency is whatever the operator bills in (``KILN_CURRENCY``).
    """

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    gpu_prices: dict[str, float] = {"H200": 4.5, "H100": 3.5, "A100": 2.0, "cpu": 0.05, "*": 2.0}
    currency: str = "USD"


def price_for(prices: dict[str, float], gpu_type: str | None) -> float:
    return prices.get(gpu_type or "*", prices.get("*", 0.0))


# ---------------------------------------------------------------------------------------------------------------
# The caller: the API's own session and principal dependencies (api/deps.py), so tenancy is the API's


def visible_team_ids(session: Session, who: Principal) -> list[int]:
    ids = who.visible_team_ids()
    return list(session.scalars(select(Team.id))) if ids is None else ids


def team_filter(session: Session, who: Principal, team: str | None) -> list[int]:
    """Teams in view, narrowed to ``team`` when given; an invisible team is as absent as a missing one."""
    ids = visible_team_ids(session, who)
    if team is None:
        return ids
    tid = session.scalar(select(Team.id).where(Team.name == team))
    if tid is None or tid not in ids:
        raise NotFound(f"team {team!r} not found")
    return [tid]


def get_visible_job(session: Session, who: Principal, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None or not who.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    return job


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt is not None else None


def _encode_cursor(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> dict[str, Any]:
    try:
        pad = "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(cursor + pad))
        if not isinstance(data, dict):
            raise ValueError
        return data
    except (ValueError, json.JSONDecodeError) as exc:
        raise InvalidInput.at("query.cursor", "malformed cursor") from exc


def effective_max_wait(session: Session, jobs: list[Job], qos_by_id: dict[int, QosClass]) -> dict[int, float | None]:
    """The contract's maximum queue wait of each job: its own contract, its spec, the team's, the QoS default."""
    if not jobs:
        return {}
    job_ids = [j.id for j in jobs]
    team_ids = {j.team_id for j in jobs}
    own = {
        c.job_id: c.max_queue_wait_s
        for c in session.scalars(select(SlaContract).where(SlaContract.job_id.in_(job_ids)))
    }
    team_default = {
        c.team_id: c.max_queue_wait_s
        for c in session.scalars(
            select(SlaContract).where(SlaContract.team_id.in_(team_ids), SlaContract.job_id.is_(None))
        )
    }
    out: dict[int, float | None] = {}
    for j in jobs:
        spec_wait = ((j.spec or {}).get("sla") or {}).get("max_queue_wait_s")
        qos = qos_by_id.get(j.qos_class_id)
        for candidate in (own.get(j.id), spec_wait, team_default.get(j.team_id),
                          qos.default_max_queue_wait_s if qos else None):  # fmt: skip
            if candidate is not None:
                out[j.id] = float(candidate)
                break
        else:
            out[j.id] = None
    return out


# ---------------------------------------------------------------------------------------------------------------
# Routes

router = APIRouter(tags=["dashboard"])


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(FRONTEND_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/v1/config/prices", summary="Price per GPU-hour by GPU type (KILN_GPU_PRICES)")
def prices(who: CurrentPrincipal) -> dict[str, Any]:
    cfg = DashboardSettings()
    return {"currency": cfg.currency, "prices": cfg.gpu_prices, "unit": "per GPU-hour (cpu: per slot-hour)"}


@router.get("/v1/dashboard/context", summary="Who is signed in, their teams and the QoS classes")
def context(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    roles = who.roles
    teams = session.scalars(select(Team).where(Team.id.in_(visible_team_ids(session, who))).order_by(Team.name))
    return {
        "user": {"name": who.name, "is_admin": who.is_admin},
        "teams": [{"name": t.name, "role": roles.get(t.id, "admin")} for t in teams],
        "qos_classes": [
            {
                "name": q.name,
                "priority": q.priority,
                "preemptible": q.preemptible,
                "default_max_queue_wait_s": q.default_max_queue_wait_s,
                "description": q.description,
            }  # fmt: skip
            for q in session.scalars(select(QosClass).order_by(QosClass.priority.desc()))
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


class QueuePage(BaseModel):
    items: list[QueueRow]
    next_cursor: str | None
    total: int


@router.get("/v1/dashboard/queue", response_model=QueuePage, summary="Jobs in queue order, with position")
def queue(
    session: SessionDep,
    who: CurrentPrincipal,
    view: Annotated[str, Query(pattern="^(waiting|active|finished)$")] = "waiting",
    team: str | None = None,
    qos: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: str | None = None,
) -> QueuePage:
    """``waiting``: QUEUED jobs in the scheduler's base order (QoS priority, job priority, submission), with the
    position in the whole queue; ``active``: admitted/running/preempting/paused; ``finished``: newest first.
    Keyset pagination: ``next_cursor`` holds the last row's sort key."""
    teams = team_filter(session, who, team)
    qos_rows = {q.id: q for q in session.scalars(select(QosClass))}
    qos_id = None
    if qos is not None:
        qos_id = next((q.id for q in qos_rows.values() if q.name == qos), None)
        if qos_id is None:
            raise NotFound(f"QoS class {qos!r} not found")
    team_names = dict(session.execute(select(Team.id, Team.name).where(Team.id.in_(teams))).tuples().all())

    conds: list[ColumnElement[bool]] = [Job.team_id.in_(teams)]
    if qos_id is not None:
        conds.append(Job.qos_class_id == qos_id)
    after = _decode_cursor(cursor) if cursor else None
    rows: list[tuple[Job, int | None]]

    if view == "waiting":
        # Position is over the whole queue (every team): "you are 57th", not "57th among what you can see".
        ranked = (
            select(
                Job.id.label("id"),
                QosClass.priority.label("qp"),
                Job.priority.label("jp"),
                func.row_number()
                .over(order_by=(QosClass.priority.desc(), Job.priority.desc(), Job.id.asc()))
                .label("pos"),
            )
            .join(QosClass, QosClass.id == Job.qos_class_id)
            .where(Job.state == "QUEUED")
            .subquery()
        )
        stmt = select(Job, ranked.c.pos).join(ranked, ranked.c.id == Job.id).where(*conds)
        total = session.scalar(select(func.count()).select_from(ranked).join(Job, Job.id == ranked.c.id).where(*conds))
        if after:
            stmt = stmt.where(ranked.c.pos > int(after.get("pos", 0)))
        stmt = stmt.order_by(ranked.c.pos.asc()).limit(limit + 1)
        rows = [(j, int(p)) for j, p in session.execute(stmt).tuples()]
    else:
        states = (*ACTIVE_STATES, "LOST") if view == "active" else FINISHED_STATES
        conds.append(Job.state.in_(states))
        total = session.scalar(select(func.count(Job.id)).where(*conds))
        stmt = select(Job).where(*conds)
        if after:
            stmt = stmt.where(Job.id < int(after.get("id", 0)))
        stmt = stmt.order_by(Job.id.desc()).limit(limit + 1)
        rows = [(j, None) for j in session.scalars(stmt)]

    more = len(rows) > limit
    rows = rows[:limit]
    max_waits = effective_max_wait(session, [j for j, _ in rows], qos_rows)
    now = utcnow()
    items = []
    for j, pos in rows:
        end = j.admitted_at or (j.finished_at if j.state in FINISHED_STATES else None) or now
        qos_row = qos_rows.get(j.qos_class_id)
        items.append(
            QueueRow(
                id=j.id,
                name=j.name,
                team=team_names.get(j.team_id, str(j.team_id)),
                qos=qos_row.name if qos_row else "?",
                state=j.state,
                position=pos,
                gpus=j.gpus,
                gpu_type=j.gpu_type,
                pending_reason=j.pending_reason,
                pending_message=j.pending_message,
                submitted_at=j.submitted_at.isoformat(),
                started_at=_iso(j.started_at),
                finished_at=_iso(j.finished_at),
                wait_s=max(0.0, (end - j.submitted_at).total_seconds()),
                max_wait_s=max_waits.get(j.id),
                last_step=j.last_step,
                steps=(j.spec or {}).get("steps"),
                last_loss=j.last_loss,
                restart_count=j.restart_count,
            )
        )
    next_cursor = None
    if more and rows:
        last_job, last_pos = rows[-1]
        next_cursor = _encode_cursor({"pos": last_pos} if view == "waiting" else {"id": last_job.id})
    return QueuePage(items=items, next_cursor=next_cursor, total=int(total or 0))


@router.get("/v1/dashboard/queue/summary", summary="Jobs waiting and running, by team and QoS class")
def queue_summary(session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    teams = visible_team_ids(session, who)
    stmt = (
        select(Team.name, QosClass.name, Job.state, func.count(Job.id), func.sum(Job.gpus), func.min(Job.submitted_at))
        .join(Team, Team.id == Job.team_id)
        .join(QosClass, QosClass.id == Job.qos_class_id)
        .where(Job.team_id.in_(teams), Job.state.in_(("QUEUED", *ACTIVE_STATES)))
        .group_by(Team.name, QosClass.name, Job.state)
    )
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    now = utcnow()
    for team, qos, state, count, gpus, oldest in session.execute(stmt).tuples():
        g = groups.setdefault((team, qos), {"team": team, "qos": qos, "waiting": 0, "active": 0,
                                            "gpus_waiting": 0, "gpus_active": 0, "oldest_wait_s": None})  # fmt: skip
        if state == "QUEUED":
            g["waiting"] += count
            g["gpus_waiting"] += int(gpus or 0)
            if oldest is not None:
                oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)
                g["oldest_wait_s"] = (now - oldest).total_seconds()
        else:
            g["active"] += count
            g["gpus_active"] += int(gpus or 0)
    reasons = session.execute(
        select(Job.pending_reason, func.count(Job.id))
        .where(Job.team_id.in_(teams), Job.state == "QUEUED")
        .group_by(Job.pending_reason)
    ).tuples()
    return {
        "groups": sorted(groups.values(), key=lambda g: (g["team"], g["qos"])),
        "pending_reasons": {(r or "NONE"): c for r, c in reasons},
    }


# ---------------------------------------------------------------------------------------------------------------
# One job: everything the job page shows except logs, in one request


def _attempt_dict(a: Attempt) -> dict[str, Any]:
    return {
        "number": a.number,
        "state": a.state,
        "placement": a.placement,
        "created_at": _iso(a.created_at),
        "started_at": _iso(a.started_at),
        "first_step_at": _iso(a.first_step_at),
        "ended_at": _iso(a.ended_at),
        "resumed_from_step": a.resumed_from_step,
        "exit_code": a.exit_code,
        "exit_reason": a.exit_reason,
    }


def restarts_with_recovery(attempts: list[Attempt]) -> list[dict[str, Any]]:
    """Each restart: the attempt that ended, why, the next one, and the recovery time (end to its first step)."""
    out = []
    for prev, nxt in zip(attempts, attempts[1:], strict=False):
        recovered = nxt.first_step_at
        recovery = (recovered - prev.ended_at).total_seconds() if (recovered and prev.ended_at) else None
        out.append(
            {
                "from_attempt": prev.number,
                "to_attempt": nxt.number,
                "reason": prev.exit_reason or prev.state,
                "ended_at": _iso(prev.ended_at),
                "resumed_at": _iso(recovered),
                "resumed_from_step": nxt.resumed_from_step,
                "recovery_s": recovery,
            }
        )
    return out


@router.get("/v1/dashboard/jobs/{job_id}", summary="Job overview: contract, attempts, restarts, checkpoints, events")
def job_overview(job_id: int, session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    return overview_of(session, get_visible_job(session, who, job_id))


def overview_of(session: Session, job: Job) -> dict[str, Any]:
    team = session.get(Team, job.team_id)
    qos_rows = {q.id: q for q in session.scalars(select(QosClass))}
    qos = qos_rows.get(job.qos_class_id)
    contract = session.scalar(select(SlaContract).where(SlaContract.job_id == job.id))
    attempts = list(session.scalars(select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)))
    checkpoints = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step))
    events = list(session.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id)))
    now = utcnow()
    end = job.admitted_at or job.finished_at or now
    return {
        "job": {
            "id": job.id,
            "name": job.name,
            "team": team.name if team else None,
            "qos": qos.name if qos else None,
            "state": job.state,
            "gpus": job.gpus,
            "gpu_type": job.gpu_type,
            "pending_reason": job.pending_reason,
            "pending_message": job.pending_message,
            "restart_count": job.restart_count,
            "last_step": job.last_step,
            "last_loss": job.last_loss,
            "steps": (job.spec or {}).get("steps"),
            "exit_reason": job.exit_reason,
            "cancel_requested": job.cancel_requested,
            "submitted_at": _iso(job.submitted_at),
            "admitted_at": _iso(job.admitted_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "wait_s": max(0.0, (end - job.submitted_at).total_seconds()),
            "max_wait_s": effective_max_wait(session, [job], qos_rows).get(job.id),
            "spec": job.spec,
        },
        "contract": None
        if contract is None
        else {
            "max_queue_wait_s": contract.max_queue_wait_s,
            "deadline": _iso(contract.deadline),
            "max_restarts": contract.max_restarts,
            "recovery_time_objective_s": contract.recovery_time_objective_s,
            "checkpoint_interval_s": contract.checkpoint_interval_s,
        },
        "attempts": [_attempt_dict(a) for a in attempts],
        "restarts": restarts_with_recovery(attempts),
        "checkpoints": [
            {
                "step": c.step,
                "path": c.path,
                "bytes": c.bytes,
                "sha256": c.sha256,
                "verified": c.verified,
                "created_at": _iso(c.created_at),
            }  # fmt: skip
            for c in checkpoints
        ],
        "events": [
            {"id": e.id, "type": e.type, "message": e.message, "data": e.data, "created_at": _iso(e.created_at)}
            for e in events
        ],
        "compile_fallbacks": [
            {"type": e.type, "message": e.message, "created_at": _iso(e.created_at)}
            for e in events
            if "FALLBACK" in e.type.upper() or "COMPILE" in e.type.upper()
        ],
        "loss_spikes": [
            {"message": e.message, "data": e.data, "created_at": _iso(e.created_at)}
            for e in events
            if "SPIKE" in e.type.upper()
        ],
    }


@router.get("/v1/dashboard/jobs/{job_id}/metrics", summary="Training telemetry after a step (for live polling)")
def job_metrics(
    job_id: int,
    session: SessionDep,
    who: CurrentPrincipal,
    after_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 2000,
) -> dict[str, Any]:
    """Rows in insertion order after ``after_id`` (a restart may repeat steps: ids never repeat)."""
    get_visible_job(session, who, job_id)
    return metrics_after(session, job_id, after_id, limit)


def metrics_after(session: Session, job_id: int, after_id: int, limit: int = 2000) -> dict[str, Any]:
    rows = list(
        session.scalars(
            select(JobMetric)
            .where(JobMetric.job_id == job_id, JobMetric.id > after_id)
            .order_by(JobMetric.id)
            .limit(limit)
        )
    )
    return {
        "items": [
            {
                "id": m.id,
                "step": m.step,
                "ts": _iso(m.ts),
                "loss": m.loss,
                "grad_norm": m.grad_norm,
                "tokens_per_s": m.tokens_per_s,
                "step_time_s": m.step_time_s,
                "mfu": m.mfu,
                "mem_peak_bytes": m.mem_peak_bytes,
                "extra": m.extra,
            }  # fmt: skip
            for m in rows
        ],
        "last_id": rows[-1].id if rows else after_id,
    }


STREAM_TICK_S = 1.0
METRICS_PER_TICK = 2000


def _sse(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get(
    "/v1/dashboard/jobs/{job_id}/stream",
    summary="Server-sent events: `overview` when the job changes, `metrics` as telemetry arrives, `end`",
    response_class=StreamingResponse,
)
async def job_stream(
    job_id: int,
    request: Request,
    who: StreamPrincipal,
    session: SessionDep,
    after_id: Annotated[int, Query(ge=0)] = 0,
) -> StreamingResponse:
    """Accepts ``access_token`` as a query parameter (EventSource cannot send headers). Each tick opens its own
    short session, so a long-lived stream holds no connection or transaction between ticks."""
    get_visible_job(session, who, job_id)
    session.close()
    resume = request.headers.get("last-event-id")
    last_id = int(resume) if resume and resume.isdigit() else after_id

    def tick(last_metric: int, fingerprint: tuple[Any, ...] | None) -> tuple[list[str], int, tuple[Any, ...], bool]:
        with request.app.state.sessionmaker() as s:
            job = s.get(Job, job_id)
            if job is None:
                return [_sse("end", {"reason": "gone"})], last_metric, (), True
            out = []
            metrics = metrics_after(s, job_id, last_metric, METRICS_PER_TICK)
            if metrics["items"]:
                last_metric = metrics["last_id"]
                out.append(_sse("metrics", metrics, str(last_metric)))
            fp = (
                job.state,
                job.updated_at,
                job.last_step,
                s.scalar(select(func.max(Event.id)).where(Event.job_id == job_id)),
                s.scalar(select(func.count(Checkpoint.id)).where(Checkpoint.job_id == job_id)),
            )
            if fp != fingerprint:
                out.append(_sse("overview", overview_of(s, job)))
            done = job.state in FINISHED_STATES and len(metrics["items"]) < METRICS_PER_TICK
            if done:
                out.append(_sse("end", {"state": job.state}))
            return out, last_metric, fp, done

    async def events() -> AsyncIterator[str]:
        nonlocal last_id
        fingerprint: tuple[Any, ...] | None = None
        yield "retry: 2000\n\n"
        while not await request.is_disconnected():
            chunks, last_id, fingerprint, done = await run_in_threadpool(tick, last_id, fingerprint)
            for chunk in chunks:
                yield chunk
            if done:
                return
            await asyncio.sleep(STREAM_TICK_S)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


# ---------------------------------------------------------------------------------------------------------------
# Teams: quota used, borrowed and lent; GPU-hours against budget; fair share


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
                "waiting": session.scalar(select(func.count(Job.id)).where(Job.team_id == t.id, Job.state == "QUEUED")),
                "active": session.scalar(
                    select(func.count(Job.id)).where(Job.team_id == t.id, Job.state.in_(ACTIVE_STATES))
                ),
            }
        )
    return {"teams": out, "fair_share_half_life_s": FAIR_SHARE_HALF_LIFE_S}


# ---------------------------------------------------------------------------------------------------------------
# SLA attainment over time


@router.get("/v1/sla/attainment", summary="SLA attainment per team and QoS class over time, and violations")
def sla_attainment(
    session: SessionDep,
    who: CurrentPrincipal,
    days: Annotated[int, Query(ge=1, le=90)] = 7,
    bucket: Annotated[str, Query(pattern="^(hour|day)$")] = "day",
    team: str | None = None,
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
        if limit is not None and waited > limit and (j.admitted_at is not None or j.state == "QUEUED"):
            reasons.append({"type": "QUEUE_WAIT", "message": f"waited {waited:.0f}s > {limit:.0f}s",
                            "at": _iso(j.submitted_at + timedelta(seconds=limit))})  # fmt: skip
        for e in violation_events.get(j.id, []):
            reasons.append({"type": e.type, "message": e.message, "at": _iso(e.created_at)})
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


# ---------------------------------------------------------------------------------------------------------------
# Cluster and cost


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
                "excluded_until": _iso(h.excluded_until),
                "exclusion_reason": h.exclusion_reason,
                "excluded": h.state == "EXCLUDED" or (h.excluded_until is not None and h.excluded_until > now),
                "last_heartbeat_at": _iso(h.last_heartbeat_at),
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
    days: Annotated[int, Query(ge=1, le=366)] = 30,
    bucket: Annotated[str, Query(pattern="^(hour|day)$")] = "day",
) -> dict[str, Any]:
    """Each usage row's GPU-seconds are spread evenly over its time span and cut into buckets."""
    cfg = DashboardSettings()
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
        price = price_for(cfg.gpu_prices, gpu_type)
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
        "currency": cfg.currency,
        "prices": cfg.gpu_prices,
        "start": datetime.fromtimestamp(first, UTC).isoformat(),
        "bucket_s": step,
        "series": series,
    }


# ---------------------------------------------------------------------------------------------------------------


def install(app: FastAPI) -> None:
    """Add the dashboard's routes and mount its static files (``/ui``) on ``app``."""
    app.include_router(router)
    app.mount("/ui", StaticFiles(directory=FRONTEND_DIR), name="dashboard-static")


__all__ = ["DashboardSettings", "install", "router"]
