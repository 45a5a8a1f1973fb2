"""Which teams a principal's views hold (a member's teams, every team for an admin), and the job states they group.

The dashboard's views (``core.services.dashboard``, ``core.services.capacity``) share these; an invisible team is as
absent as a missing one."""

from __future__ import annotations

from sqlalchemy.orm import Session

from core.repositories import teams as teams_repo
from core.services.errors import NotFound
from core.services.principal import Principal
from core.states import ACTIVE, TERMINAL, JobState

ACTIVE_STATES = tuple(s.value for s in JobState if s in ACTIVE)
FINISHED_STATES = tuple(s.value for s in JobState if s in TERMINAL)  # LOST is not: the reconciler requeues it


def visible_team_ids(db: Session, who: Principal) -> list[int]:
    ids = who.visible_team_ids()
    return teams_repo.all_ids(db) if ids is None else ids


def team_filter(db: Session, who: Principal, team: str | None) -> list[int]:
    """Teams in view, narrowed to ``team`` when given."""
    ids = visible_team_ids(db, who)
    if team is None:
        return ids
    tid = teams_repo.id_by_name(db, team)
    if tid is None or tid not in ids:
        raise NotFound(f"team {team!r} not found")
    return [tid]
