"""The FastAPI application factory: ``uvicorn api.app:create_app --factory``."""

from __future__ import annotations

import logging
import re
import select
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import sessionmaker

from api import errors, openapi
from api.metrics import http_metrics_registry
from api.middleware import BodyLimitMiddleware, MetricsMiddleware, SecurityHeadersMiddleware
from api.ratelimit import FailedAuthentications, make_limiter
from api.routers import (
    artifacts,
    cluster,
    datasets,
    estimates,
    exports,
    health,
    jobs,
    oidc,
    qos,
    sla,
    streams,
    sweeps,
    teams,
    tokens,
    usage,
    users,
    webhooks,
)
from api.routers.health import register_collectors
from core.db import make_engine
from core.deployment import StorageOfAnotherDeployment, check_storage
from core.settings import Settings, get_settings
from scheduler.live.forecast import forecast_start, would_be_projector

log = logging.getLogger("kiln.api")

DESCRIPTION = """GPU training jobs under SLA contracts. Bearer tokens (`Authorization: Bearer kiln_...`);
every error is RFC 9457 `application/problem+json`. See docs/api.md."""


ROUTERS = (
    # jobs first: the router tries routes in order, and its two hot paths are most of the traffic
    jobs,
    health,
    users,
    tokens,
    oidc,
    streams,
    teams,
    artifacts,
    datasets,
    qos,
    sla,
    sweeps,
    cluster,
    usage,
    webhooks,
    exports,
    estimates,
)


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    settings = settings or get_settings()
    owns_engine = engine is None
    engine = engine or make_api_engine(settings)
    # /docs is kiln's own page over vendored Swagger UI (api/routers/dashboard/docs.py): FastAPI's loads it from a
    # CDN. No ReDoc.
    app = FastAPI(
        title="kiln",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=_lifespan(settings, engine, owns_engine),
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
    )
    _set_state(app, settings, engine)
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)
    _install_dashboard(app)

    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, streamed=re.compile(artifacts.UPLOAD_PATH)
    )
    app.add_middleware(MetricsMiddleware, registry=http_metrics_registry(app.state.registry))  # counts 413s too
    app.add_middleware(SecurityHeadersMiddleware)  # outermost: on every response
    app.openapi = lambda: openapi.document(app)  # type: ignore[method-assign]
    return app


def _lifespan(
    settings: Settings, engine: Engine, owns_engine: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # It serves logs and stores code there: the storage must be this database's. A database down at the start is
        # not a reason to stay down (the API answers 503 until it is back); then the first request that touches
        # the storage checks it (api.deps.get_storage_dir).
        try:
            with app.state.sessionmaker() as db:
                check_storage(db, settings.resolved_storage_dir)
            app.state.storage_checked = True
        except StorageOfAnotherDeployment:
            raise
        except Exception as exc:
            log.warning(
                "could not check who owns the storage directory (%s) yet: %s", settings.resolved_storage_dir, exc
            )
        yield
        if owns_engine:
            engine.dispose()

    return lifespan


def _set_state(app: FastAPI, settings: Settings, engine: Engine) -> None:
    """What the routers and dependencies find on ``app.state``: settings, sessions, limiters, the forecaster."""
    app.state.settings = settings
    app.state.storage_checked = False  # api.deps.get_storage_dir
    app.state.engine = engine
    app.state.sessionmaker = sessionmaker(bind=engine, expire_on_commit=False)
    app.state.limiter = make_limiter(
        settings.resolved_broker_url, settings.rate_limit_per_minute, settings.rate_limit_burst
    )
    app.state.auth_failures = FailedAuthentications(
        make_limiter(
            settings.resolved_broker_url,
            settings.auth_failures_per_minute,
            settings.auth_failures_burst,
            prefix="kiln:authfail:",
        )
    )
    # The expected start is the scheduler's own plan() run forward (core.services.why): wired in here, the API's
    # composition root, so no router or service imports the scheduler.
    policy = settings.policy
    app.state.forecaster = lambda db, job, now: forecast_start(db, job, now=now, policy=policy)
    app.state.would_start = lambda db, now: would_be_projector(db, now=now, policy=policy)  # estimates
    app.state.registry = CollectorRegistry()
    register_collectors(app.state.registry)


def make_api_engine(settings: Settings) -> Engine:
    """The API's engine. On PostgreSQL: a pool for 32 concurrent clients over 2 workers (each worker's thread
    pool runs at most 40 handlers; 16 connections cover its share, 16 more absorb bursts), and instead of
    ``pool_pre_ping`` (a ``BEGIN; SELECT 1`` round trip on every checkout) a check that costs no round trip: an idle
    connection has nothing to read, so a readable socket means the server closed it (restart, failover,
    ``pg_terminate_backend``); the pool then replaces it before the request sees it."""
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        return make_engine(url, settings=settings)
    engine = make_engine(url, settings=settings, pool_size=16, max_overflow=16, pool_pre_ping=False)

    @event.listens_for(engine, "checkout")
    def _alive(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if getattr(dbapi_conn, "closed", False):
            raise DisconnectionError("connection closed")
        try:
            readable, _, _ = select.select([dbapi_conn.fileno()], [], [], 0)
        except (OSError, ValueError) as exc:
            raise DisconnectionError(str(exc)) from exc
        if readable:
            raise DisconnectionError("the server closed the connection (or sent something unasked)")

    return engine


def _install_dashboard(app: FastAPI) -> None:
    """The dashboard's static files and read-only views (api/routers/dashboard/), when present."""
    try:
        from api.routers import dashboard
    except ImportError:  # pragma: no cover - the dashboard is optional
        return
    dashboard.install(app)
