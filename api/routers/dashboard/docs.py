"""``/docs``: interactive API docs from kiln's own files (Swagger UI vendored under ``frontend/apidocs/``), so
they work offline and the page loads no script from another origin."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.routers.dashboard.common import FRONTEND_DIR

router = APIRouter(tags=["dashboard"])


@router.get("/docs", include_in_schema=False)
def docs() -> FileResponse:
    return FileResponse(FRONTEND_DIR / "apidocs" / "index.html", headers={"Cache-Control": "no-cache"})
