"""Shared by the dashboard's views: prices, tenancy helpers, cursors, effective max queue wait."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import (
    Job,
    QosClass,
    SlaContract,
    Team,
)
from core.services.errors import NotFound
from core.services.principal import Principal
from core.states import ACTIVE, TERMINAL, JobState

FRONTEND_DIR = Path(__file__).resolve().parents[3] / "frontend"

ACTIVE_STATES = tuple(s.value for s in JobState if s in ACTIVE)
FINISHED_STATES = tuple(s.value for s in JobState if s in TERMINAL)  # LOST is not: the reconciler requeues it
MAX_PAGE = 200


def price_for(prices: dict[str, float], gpu_type: str | None) -> float:
    return prices.get(gpu_type or "*", prices.get("*", 0.0))  # usage rows carry the type the GPU registered


# ---------------------------------------------------------------------------------------------------------------
# The caller: the API's own session and principal dependencies (api/deps.py), so tenancy is the API's


def visible_team_ids(session: Session, who: Principal) -> list[int]:
    ids = who.visible_team_ids()
    return list(session.scalars(select(Team.id))) if ids is None else ids


def team_filter(session: Session, who: Principal, team: str | None) -> list[int]:
    """Teams in view, narrowed to ``team`` when given; an invisible team is as absent as a missing one."""
    ids = visible_team_ids(session, who)
    if team is None:
        return ids
    tid = session.scalar(select(Team.id).where(Team.name == team))
    if tid is None or tid not in ids:
        raise NotFound(f"team {team!r} not found")
    return [tid]


def get_visible_job(session: Session, who: Principal, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None or not who.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    return job


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt is not None else None


def effective_max_wait(session: Session, jobs: list[Job], qos_by_id: dict[int, QosClass]) -> dict[int, float | None]:
    """The contract's maximum queue wait of each job: its own contract, its spec, the team's, the QoS default."""
    if not jobs:
        return {}
    job_ids = [j.id for j in jobs]
    team_ids = {j.team_id for j in jobs}
    own = {
        c.job_id: c.max_queue_wait_s
        for c in session.scalars(select(SlaContract).where(SlaContract.job_id.in_(job_ids)))
    }
    team_default = {
        c.team_id: c.max_queue_wait_s
        for c in session.scalars(
            select(SlaContract).where(SlaContract.team_id.in_(team_ids), SlaContract.job_id.is_(None))
        )
    }
    out: dict[int, float | None] = {}
    for j in jobs:
        spec_wait = ((j.spec or {}).get("sla") or {}).get("max_queue_wait_s")
        qos = qos_by_id.get(j.qos_class_id)
        for candidate in (own.get(j.id), spec_wait, team_default.get(j.team_id),
                          qos.default_max_queue_wait_s if qos else None):  # fmt: skip
            if candidate is not None:
                out[j.id] = float(candidate)
                break
        else:
            out[j.id] = None
    return out


#
