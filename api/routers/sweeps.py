"""Sweeps: submit a job spec with a ``sweep`` section (grid, list or random draws), read its jobs best first."""

from __future__ import annotations

import json
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool

from api.bodies import yaml_body
from api.deps import CurrentPrincipal, SessionDep
from api.job_bodies import JSON_TYPES, YAML_TYPES, CancelIn, HoldIn
from api.routers.common import (
    ERRORS,
    LOCATION,
    PAGE_DEFAULT,
    CursorQuery,
    LimitQuery,
    SweepIdPath,
    paged,
    paged_query,
)
from api.schemas.sweeps import SweepCurvesOut, SweepJobOut, SweepJobPageOut, SweepOut, SweepPageOut
from core.services.fit import FitSettings
from core.spec import SpecError
from core.sweeps import curves as sweep_curves
from core.sweeps import service as svc

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=ERRORS)

SWEEP_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "A job spec with a sweep section: "
                    "{grid: {key: [values]}}, {list: [{key: value}]} or {random: {key: "
                    "[values] | {uniform|log_uniform|int_uniform: [low, high]}}, count, "
                    "seed}; max_concurrent; objective: {metric, goal}",
                }
            },
            **{t: {"schema": {"type": "string", "description": "The same, as YAML"}} for t in sorted(YAML_TYPES)},
        },
    }
}


async def document_from_body(request: Request) -> dict[str, Any]:
    """The sweep document, read within bounds (``api.bodies``: depth, and a YAML document's size)."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    body = await request.body()
    if ctype in JSON_TYPES:
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise SpecError(
                "the body is not a readable JSON document", [{"loc": "$", "msg": str(exc)[:200], "type": "parse"}]
            ) from None
    elif ctype in YAML_TYPES:
        data = yaml_body(body)
    else:
        raise HTTPException(415, f"submit the sweep as application/json or YAML ({', '.join(sorted(YAML_TYPES))})")
    if not isinstance(data, dict):
        raise SpecError("a sweep is a mapping", [{"loc": "$", "msg": "expected a mapping", "type": "type"}])
    return data


@router.post(
    "",
    response_model=SweepOut,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=SWEEP_BODY,
    summary="Submit a sweep: one job per point of its grid or list",
    responses=LOCATION,
)
async def submit_sweep(
    request: Request,
    db: SessionDep,
    who: CurrentPrincipal,
    response: Response,
    hold: Annotated[bool, Query(description="Submit its jobs held: they wait until released")] = False,
) -> SweepOut:
    document = await document_from_body(request)
    settings = request.app.state.settings
    view = await run_in_threadpool(
        svc.submit_sweep,
        db=db,
        principal=who,
        document=document,
        hold=hold,
        max_unfinished=settings.max_unfinished_jobs_per_team,
        fit=FitSettings.of(settings),
    )
    response.headers["Location"] = f"/v1/sweeps/{view.sweep.id}"
    return SweepOut.from_view(view)


@router.get("", response_model=SweepPageOut, summary="Sweeps you can see, newest first")
def list_sweeps(
    db: SessionDep,
    who: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=50)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> SweepPageOut:
    rows, more = paged_query(partial(svc.list_sweeps, db=db, principal=who), lambda s: (-s.id,), (0,), limit, cursor)
    items = [SweepOut.from_view(svc.get(db=db, principal=who, sweep_id=s.id)) for s in rows]
    return SweepPageOut(items=items, next_cursor=more)


@router.get("/{sweep_id}", response_model=SweepOut, summary="A sweep and its jobs, best first")
def get_sweep(sweep_id: SweepIdPath, db: SessionDep, who: CurrentPrincipal) -> SweepOut:
    return SweepOut.from_view(svc.get(db=db, principal=who, sweep_id=sweep_id))


@router.get("/{sweep_id}/jobs", response_model=SweepJobPageOut, summary="A sweep's jobs by id, a page at a time")
def list_sweep_jobs(
    sweep_id: SweepIdPath,
    db: SessionDep,
    who: CurrentPrincipal,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> SweepJobPageOut:
    view = svc.get(db=db, principal=who, sweep_id=sweep_id)
    rows, more = paged(view.jobs, lambda j: (j.id,), limit, cursor)
    return SweepJobPageOut(items=[SweepJobOut.from_job(j, view.keys) for j in rows], next_cursor=more)


@router.get("/{sweep_id}/curves", response_model=SweepCurvesOut, summary="Each job's objective over its steps")
def get_sweep_curves(sweep_id: SweepIdPath, db: SessionDep, who: CurrentPrincipal) -> SweepCurvesOut:
    return SweepCurvesOut.from_curves(*sweep_curves.curves(db=db, principal=who, sweep_id=sweep_id))


@router.post("/{sweep_id}/hold", response_model=SweepOut, summary="Hold the sweep's queued jobs, all at once")
def hold_sweep(sweep_id: SweepIdPath, db: SessionDep, who: CurrentPrincipal, body: HoldIn = HoldIn()) -> SweepOut:
    return SweepOut.from_view(svc.hold_queued(db=db, principal=who, sweep_id=sweep_id, reason=body.reason))


@router.post("/{sweep_id}/release", response_model=SweepOut, summary="Release the sweep's held jobs, all at once")
def release_sweep(sweep_id: SweepIdPath, db: SessionDep, who: CurrentPrincipal) -> SweepOut:
    return SweepOut.from_view(svc.release_held(db=db, principal=who, sweep_id=sweep_id))


@router.post("/{sweep_id}/cancel", response_model=SweepOut, summary="Cancel every job of the sweep not yet ended")
def cancel_sweep(sweep_id: SweepIdPath, db: SessionDep, who: CurrentPrincipal, body: CancelIn = CancelIn()) -> SweepOut:
    return SweepOut.from_view(svc.cancel_all(db=db, principal=who, sweep_id=sweep_id, reason=body.reason))
