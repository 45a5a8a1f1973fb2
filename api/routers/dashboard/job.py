"""One job: everything the job page shows except logs, in one request, and its live SSE stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from api import sse
from api.deps import CurrentPrincipal, SessionDep, SessionFactoryDep, StreamPrincipal
from api.routers.common import JobIdPath, LastEventIdQuery, StreamTicketQuery
from api.routers.dashboard.common import iso
from api.schemas.common import INT64
from core.db import utcnow
from core.event_types import EventType
from core.models import Attempt, Event, Job, SlaContract
from core.queue_wait import queued_seconds
from core.recipes import throughput_unit
from core.repositories.compile_cache import COMPILE_EVENT_TYPES
from core.services import compile_cache, dashboard
from core.services import datasets as datasets_svc
from core.services.compile_cache import AttemptCompile, compile_off
from core.services.dashboard import JobOverview, get_visible_job
from core.services.sla import step_standing
from core.services.visibility import FINISHED_STATES
from core.trainer_protocol import command_exit_code

router = APIRouter(tags=["dashboard"])


def _attempt_dict(a: Attempt, compiled: AttemptCompile, command_codes: dict[int, int]) -> dict[str, Any]:
    return {
        "number": a.number,
        "state": a.state,
        "placement": a.placement,
        "created_at": iso(a.created_at),
        "started_at": iso(a.started_at),
        "first_step_at": iso(a.first_step_at),
        "ended_at": iso(a.ended_at),
        "resumed_from_step": a.resumed_from_step,
        # The job's own command's code where it ran one (a script), as `kiln describe` shows it; else kiln's.
        "exit_code": command_codes.get(a.number, a.exit_code),
        "exit_reason": a.exit_reason,
        "compile": {**asdict(compiled), "summary": compiled.summary},
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
                "ended_at": iso(prev.ended_at),
                "resumed_at": iso(recovered),
                "resumed_from_step": nxt.resumed_from_step,
                "recovery_s": recovery,
            }
        )
    return out


@router.get("/v1/dashboard/jobs/{job_id}", summary="Job overview: contract, attempts, restarts, checkpoints, events")
def job_overview(job_id: JobIdPath, session: SessionDep, who: CurrentPrincipal) -> dict[str, Any]:
    return overview_of(session, get_visible_job(session, who, job_id))


def _code(job: Job, team: str) -> dict[str, Any] | None:
    """The team's own code a job runs: digest, entry point, and the archive's API path (docs/user-code.md)."""
    code = (job.spec or {}).get("code") or {}
    digest = code.get("digest")
    if not digest:
        return None
    return {
        "digest": digest,
        "entry_point": code.get("entry_point"),
        "download": f"/v1/teams/{team}/artifacts/{digest}/archive",
    }


def _datasets(session: Session, job: Job) -> list[dict[str, Any]]:
    """The datasets a job's spec names, each with its registered path (None: removed since the submit)."""
    names = [str(n) for n in (job.spec or {}).get("datasets") or []]
    paths = datasets_svc.paths_for(session, team_id=job.team_id, names=names)
    return [{"name": n, "path": paths.get(n), "read_only": True} for n in names]


def overview_of(session: Session, job: Job) -> dict[str, Any]:
    view = dashboard.job_overview(session, job)
    team, attempts, events = view.team, view.attempts, view.events
    compiles = compile_cache.summarise(events, attempts, compile_off=compile_off(job))
    codes = dict(c for e in events if (c := command_exit_code(e.type, e.data)) is not None)
    return {
        "job": _job_dict(view, utcnow()),
        "code": _code(job, team.name if team else ""),
        "datasets": _datasets(session, job),
        "evaluations": [
            {"step": e.data.get("step"), "metrics": e.data.get("metrics") or {}, "attempt": e.data.get("attempt")}
            for e in events
            if e.type == EventType.EVALUATION
        ],
        "contract": _contract_dict(session, job, view.contract),
        "attempts": [_attempt_dict(a, c, codes) for a, c in zip(attempts, compiles, strict=True)],
        "restarts": restarts_with_recovery(attempts),
        "checkpoints": [
            {
                "step": c.step,
                "path": c.path,
                "bytes": c.bytes,
                "sha256": c.sha256,
                "verified": c.verified,
                "created_at": iso(c.created_at),
            }
            for c in view.checkpoints
        ],
        **_timeline(events),
    }


def _job_dict(view: JobOverview, now: datetime) -> dict[str, Any]:
    job, team, qos = view.job, view.team, view.qos
    return {
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
        "throughput_unit": throughput_unit(job.spec or {}),
        "exit_reason": job.exit_reason,
        "cancel_requested": job.cancel_requested,
        "held_at": iso(job.held_at),
        "submitted_at": iso(job.submitted_at),
        "admitted_at": iso(job.admitted_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "wait_s": queued_seconds(job, now),
        "max_wait_s": view.max_wait_s,
        "evaluation": job.eval_metrics,
        "spec": job.spec,
    }


def _contract_dict(session: Session, job: Job, contract: SlaContract | None) -> dict[str, Any] | None:
    if contract is None:
        return None
    return {
        "max_queue_wait_s": contract.max_queue_wait_s,
        "deadline": iso(contract.deadline),
        "max_restarts": contract.max_restarts,
        "recovery_time_objective_s": contract.recovery_time_objective_s,
        "checkpoint_interval_s": contract.checkpoint_interval_s,
        # the terms measured from the job's steps: met, violated, or unmeasured (steps too few or too brief to
        # compare, a script that reports none, or the step time of a best-effort GPU share)
        "standing": step_standing(session, job=job, contract=contract),
    }


def _timeline(events: list[Event]) -> dict[str, list[dict[str, Any]]]:
    """The job's events, and those of them the page shows apart: compile fallbacks and loss spikes."""
    return {
        "events": [
            {"id": e.id, "type": e.type, "message": e.message, "data": e.data, "created_at": iso(e.created_at)}
            for e in events
        ],
        "compile_fallbacks": [
            {"type": e.type, "message": e.message, "created_at": iso(e.created_at)}
            for e in events
            # the compile cache's own events are each attempt's compile (above), not fallbacks
            if "FALLBACK" in e.type.upper() or ("COMPILE" in e.type.upper() and e.type not in COMPILE_EVENT_TYPES)
        ],
        "loss_spikes": [
            {"message": e.message, "data": e.data, "created_at": iso(e.created_at)}
            for e in events
            if "SPIKE" in e.type.upper()
        ],
    }


@router.get("/v1/dashboard/jobs/{job_id}/metrics", summary="Training telemetry after a step (for live polling)")
def job_metrics(
    job_id: JobIdPath,
    session: SessionDep,
    who: CurrentPrincipal,
    after_id: Annotated[int, Query(ge=0, le=INT64)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 2000,
) -> dict[str, Any]:
    """Rows in insertion order after ``after_id`` (a restart may repeat steps: ids never repeat)."""
    get_visible_job(session, who, job_id)
    return metrics_after(session, job_id, after_id, limit)


def metrics_after(session: Session, job_id: int, after_id: int, limit: int = 2000) -> dict[str, Any]:
    rows = dashboard.metrics_after(session, job_id, after_id, limit)
    return {
        "items": [
            {
                "id": m.id,
                "step": m.step,
                "ts": iso(m.ts),
                "loss": m.loss,
                "grad_norm": m.grad_norm,
                "tokens_per_s": m.tokens_per_s,
                "step_time_s": m.step_time_s,
                "mfu": m.mfu,
                "mem_peak_bytes": m.mem_peak_bytes,
                "extra": m.extra,
            }
            for m in rows
        ],
        "last_id": rows[-1].id if rows else after_id,
    }


STREAM_TICK_S = 1.0
METRICS_PER_TICK = 2000


@router.get(
    "/v1/dashboard/jobs/{job_id}/stream",
    summary="Server-sent events: `overview` when the job changes, `metrics` as telemetry arrives, `end`",
    response_class=StreamingResponse,
)
async def job_stream(
    job_id: JobIdPath,
    request: Request,
    who: StreamPrincipal,
    session: SessionDep,
    sessions: SessionFactoryDep,
    after_id: Annotated[int, Query(ge=0, le=INT64)] = 0,
    ticket: StreamTicketQuery = None,
    last_event_id: LastEventIdQuery = None,
) -> StreamingResponse:
    """Takes a stream ticket as ``?ticket=`` (EventSource cannot send headers). Each tick opens its own short
    session, so a long-lived stream holds no connection or transaction between ticks; the caller is checked
    again while it runs, and ``Last-Event-ID`` (the last metric id) resumes it (api/sse.py)."""
    job = get_visible_job(session, who, job_id)
    guard = sse.Guard(request, sessions, who, job.team_id)
    session.close()
    resume = sse.last_event_id(request)
    last_id = int(resume) if resume and resume.isdigit() and int(resume) <= INT64 else after_id

    def tick(last_metric: int, fingerprint: tuple[Any, ...] | None) -> tuple[list[str], int, tuple[Any, ...], bool]:
        if not guard.allowed_now():
            return [sse.UNAUTHORIZED], last_metric, (), True
        with request.app.state.sessionmaker() as s:
            job = dashboard.job_or_none(s, job_id)  # the guard above rechecked the caller
            if job is None:
                return [sse.event("end", {"reason": "gone"})], last_metric, (), True
            out = []
            metrics = metrics_after(s, job_id, last_metric, METRICS_PER_TICK)
            if metrics["items"]:
                last_metric = metrics["last_id"]
                out.append(sse.event("metrics", metrics, str(last_metric)))
            fp = dashboard.job_fingerprint(s, job)
            if fp != fingerprint:
                out.append(sse.event("overview", overview_of(s, job)))
            done = job.state in FINISHED_STATES and len(metrics["items"]) < METRICS_PER_TICK
            if done:
                out.append(sse.event("end", {"state": job.state}))
            return out, last_metric, fp, done

    async def events() -> AsyncIterator[str]:
        nonlocal last_id
        fingerprint: tuple[Any, ...] | None = None
        yield "retry: 2000\n\n"
        last_sent = time.monotonic()
        while not await request.is_disconnected():
            chunks, last_id, fingerprint, done = await run_in_threadpool(tick, last_id, fingerprint)
            for chunk in chunks:
                yield chunk
            if chunks:
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= sse.keepalive_s(request):
                yield sse.KEEPALIVE
                last_sent = time.monotonic()
            if done:
                return
            await asyncio.sleep(STREAM_TICK_S)

    return StreamingResponse(events(), media_type="text/event-stream", headers=sse.HEADERS)
