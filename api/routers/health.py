"""Liveness, readiness (the database answers) and Prometheus metrics: HTTP, jobs by state, and the operators'
metrics (SLA attainment, queue wait, pending reasons, preemptions, restarts, recovery time, GPUs, hosts) computed
from the database at scrape time by core/services/ops_metrics.py.

``/metrics`` names every team and runs aggregate queries: it answers only a token with the ``metrics`` scope (a
scrape-only token an admin issues for Prometheus) or an admin's token; anyone else gets 401/403."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from sqlalchemy import text

from api.auth import principal_for
from api.deps import SessionDep
from api.schemas.common import problem_responses
from core.repositories import jobs as jobs_repo
from core.services import ops_metrics
from core.states import JobState

router = APIRouter(tags=["health"], responses=problem_responses(500, 503))


@router.get("/healthz", summary="The process is alive")
def get_health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers (503 otherwise)")
def get_readiness(db: SessionDep) -> dict[str, str]:
    db.execute(text("SELECT 1"))
    return {"status": "ready"}


def jobs_gauge(registry: CollectorRegistry) -> Gauge:
    """The ``kiln_jobs`` gauge; also registers the operators' collector on ``registry`` (create_app calls this
    once per app with the app's registry)."""
    registry.register(ops_metrics.OpsMetricsCollector())
    return Gauge("kiln_jobs", "Jobs by state", ["state"], registry=registry)


@router.get(
    "/metrics",
    summary="Prometheus metrics (a token with the 'metrics' scope, or an admin's)",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
        **problem_responses(401, 403, 429),
    },
)
def get_prometheus_metrics(request: Request, db: SessionDep) -> Response:
    principal_for(request, db, scope="metrics")
    gauge: Gauge = request.app.state.jobs_gauge
    counts = jobs_repo.count_by_state(db)
    for state in JobState:
        gauge.labels(state.value).set(counts.get(state.value, 0))
    with ops_metrics.scraping(db):
        body = generate_latest(request.app.state.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
