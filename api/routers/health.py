"""Liveness, readiness (the database answers) and Prometheus metrics: HTTP, jobs by state, and the operators'
metrics (SLA attainment, queue wait, pending reasons, preemptions, restarts, recovery time, GPUs, hosts) computed
from the database at scrape time by core/services/ops_metrics.py.

``/metrics`` names every team and runs aggregate queries: it answers only a token with the ``metrics`` scope (a
scrape-only token an admin issues for Prometheus) or an admin's token; anyone else gets 401/403."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text

from api.auth import principal_for
from api.deps import SessionDep
from api.metrics import scrape_registry
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


class JobsByStateCollector(Collector):
    """``kiln_jobs`` by state, counted in the database at scrape time (so every API process reports the same)."""

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("kiln_jobs", "Jobs by state", labels=["state"])
        session = ops_metrics.scrape_session()
        if session is None:
            return []
        counts = jobs_repo.count_by_state(session)
        for state in JobState:
            family.add_metric([state.value], counts.get(state.value, 0))
        return [family]

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily("kiln_jobs", "Jobs by state", labels=["state"])]


def register_collectors(registry: CollectorRegistry) -> None:
    """The database's metrics on the app's registry (create_app calls this once per app)."""
    registry.register(JobsByStateCollector())
    registry.register(ops_metrics.OpsMetricsCollector())


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
    with ops_metrics.scraping(db):
        body = generate_latest(scrape_registry(request.app.state.registry))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
