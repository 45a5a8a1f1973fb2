"""GPU-seconds per team and GPU type (the usage table, one row per attempt)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Usage


def gpu_seconds_by_team_and_type(
    db: Session, *, team_ids: Sequence[int], since: datetime, until: datetime
) -> list[tuple[int, str, float]]:
    """Attempts that started inside [since, until): (team_id, gpu_type, gpu_seconds)."""
    if not team_ids:
        return []
    stmt = (
        select(Usage.team_id, Usage.gpu_type, func.coalesce(func.sum(Usage.gpu_seconds), 0.0))
        .where(Usage.team_id.in_(team_ids), Usage.started_at >= since, Usage.started_at < until)
        .group_by(Usage.team_id, Usage.gpu_type)
        .order_by(Usage.team_id, Usage.gpu_type)
    )
    return [(int(t), str(g), float(s)) for t, g, s in db.execute(stmt).tuples()]
