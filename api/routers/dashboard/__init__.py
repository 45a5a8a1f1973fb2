"""The web dashboard: static files under ``frontend/`` served at ``/``, and the read-only views it needs.

No Node build step: ``frontend/`` is plain HTML, ES modules and CSS, mounted as it is (see docs/dashboard.md).
The views are aggregate, read-only queries the domain routers do not offer (queue order and position, quota
usage, SLA attainment, cost, a one-request job overview), one module per page; a job, the job list, a job's
timeline and its metrics they read as ``/v1/jobs`` does (``core.services.jobs``, ``core.repositories.jobs``). They
respect tenancy like the rest of the API: a member sees only their teams, an admin sees all, another team's job
answers 404.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.routers.dashboard import cluster, docs, job, queue, sla, teams
from api.routers.dashboard.common import FRONTEND_DIR


def install(app: FastAPI) -> None:
    """Add the dashboard's routes and mount its static files (``/ui``) on ``app``."""
    for module in (queue, job, teams, sla, cluster, docs):
        app.include_router(module.router)
    app.mount("/ui", StaticFiles(directory=FRONTEND_DIR), name="dashboard-static")


__all__ = ["install"]
