"""Estimates: what a job would need, take and cost, per option, before it is submitted (nothing is created)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentPrincipal, SessionDep
from api.job_bodies import SUBMIT_BODY, spec_from_body
from api.routers.common import ERRORS
from api.schemas.estimates import EstimateOut, estimate_out
from core.db import utcnow
from core.services import estimates as svc
from core.services.fit import FitSettings

router = APIRouter(prefix="/v1/estimates", tags=["estimates"], responses=ERRORS)

# The submission's body (a JobSpec, JSON or YAML), without its Idempotency-Key: an estimate creates nothing.
ESTIMATE_BODY: dict[str, Any] = {"requestBody": SUBMIT_BODY["requestBody"]}


@router.post(
    "",
    response_model=EstimateOut,
    summary="Estimate a job's memory, step time, GPU-hours and cost per "
    "option, and the cheapest that meets its deadline",
    openapi_extra=ESTIMATE_BODY,
)
async def create_estimate(request: Request, db: SessionDep, who: CurrentPrincipal) -> EstimateOut:
    spec = await spec_from_body(request)
    settings = request.app.state.settings
    result = await run_in_threadpool(
        svc.estimate,
        db=db,
        principal=who,
        spec=spec,
        now=utcnow(),
        prices=settings.gpu_prices,
        currency=settings.currency,
        fit=FitSettings.of(settings),
        would_start=getattr(request.app.state, "would_start", None),
    )
    return estimate_out(result)
