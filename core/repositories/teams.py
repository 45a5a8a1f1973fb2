"""Teams, quotas, memberships and team default SLA contracts."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Job, Membership, SlaContract, Team, User


def get_by_name(db: Session, name: str) -> Team | None:
    return db.scalars(select(Team).where(Team.name == name)).one_or_none()


def get_by_id(db: Session, team_id: int) -> Team | None:
    return db.get(Team, team_id)


def list_teams(db: Session, team_ids: Sequence[int] | None) -> Sequence[Team]:
    stmt = select(Team).order_by(Team.name)
    if team_ids is not None:
        stmt = stmt.where(Team.id.in_(team_ids))
    return db.scalars(stmt).all()


def names_by_id(db: Session, team_ids: Sequence[int]) -> dict[int, str]:
    if not team_ids:
        return {}
    return dict(db.execute(select(Team.id, Team.name).where(Team.id.in_(set(team_ids)))).tuples().all())


def has_jobs(db: Session, team_id: int) -> bool:
    return db.scalar(select(Job.id).where(Job.team_id == team_id).limit(1)) is not None


def get_membership(db: Session, *, team_id: int, user_id: int) -> Membership | None:
    return db.scalars(
        select(Membership).where(Membership.team_id == team_id, Membership.user_id == user_id)
    ).one_or_none()


def list_members(db: Session, team_id: int) -> Sequence[tuple[Membership, str]]:
    rows = db.execute(
        select(Membership, User.name)
        .join(User, User.id == Membership.user_id)
        .where(Membership.team_id == team_id)
        .order_by(User.name)
    )
    return rows.tuples().all()


def roles_of_user(db: Session, user_id: int) -> dict[int, str]:
    rows = db.execute(select(Membership.team_id, Membership.role).where(Membership.user_id == user_id))
    return dict(rows.tuples().all())


def default_sla(db: Session, team_id: int) -> SlaContract | None:
    return db.scalars(
        select(SlaContract).where(SlaContract.team_id == team_id, SlaContract.job_id.is_(None)).limit(1)
    ).first()
