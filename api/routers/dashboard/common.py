"""Shared by the dashboard's views: where the static files are, the page size, timestamps."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

FRONTEND_DIR = Path(__file__).resolve().parents[3] / "frontend"

MAX_PAGE = 200


def iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt is not None else None


def utc_iso(dt: datetime | None) -> str | None:
    """A time read in the database session's zone, as an ISO timestamp in UTC."""
    return dt.astimezone(UTC).isoformat() if dt is not None else None


def epoch_iso(epoch_s: int) -> str:
    """A bucket's start (epoch seconds) as an ISO timestamp in UTC."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()
