"""Teams (quotas, cohort, fair share, budget, the QoS classes and restart limit they may use) and memberships,
with audit events for membership changes. A team-admin adds a new member by invitation only
(``core.services.invitations``): the user joins by accepting it; an admin adds members directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from core.event_types import EventType
from core.models import Membership, QosClass, Role, SlaContract, Team, TeamQuota, User
from core.repositories import qos as qos_repo
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.services.errors import Conflict, Forbidden, InvalidInput, NotFound, PreconditionFailed
from core.services.fit import FitSettings, check_quota_type
from core.services.principal import Principal, require_admin, require_team
from core.transitions import record_event

DEFAULT_QOS = "silver"
# What a new team may use until an admin decides otherwise: the classes that take no capacity from others by
# right (gold is never preempted by a lower class: granting it is an admin's decision).
DEFAULT_TEAM_QOS = ("silver", "bronze", "best-effort")
DEFAULT_RESTART_LIMIT = 10
TEAM_FIELDS = ("cohort", "fair_share_weight", "gpu_hour_budget", "budget_period_s", "restart_limit")


@dataclass(frozen=True)
class Quota:
    gpu_type: str
    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None


def _quota_rows(db: Session, quotas: Sequence[Quota], fit: FitSettings) -> list[TeamQuota]:
    seen: set[str] = set()
    rows = []
    for i, q in enumerate(quotas):
        gpu_type = check_quota_type(db, q.gpu_type, loc=f"quotas.{i}.gpu_type", fit=fit)
        if gpu_type in seen:
            raise InvalidInput.at(f"quotas.{i}.gpu_type", f"duplicate GPU type {gpu_type!r}")
        seen.add(gpu_type)
        rows.append(
            TeamQuota(
                gpu_type=gpu_type,
                nominal=q.nominal,
                borrowing_limit=q.borrowing_limit,
                lending_limit=q.lending_limit,
            )
        )
    return rows


def _qos_classes(db: Session, names: Sequence[str]) -> list[QosClass]:
    rows = []
    for i, name in enumerate(names):
        qos = qos_repo.get_by_name(db, name)
        if qos is None:
            raise InvalidInput.at(f"qos_classes.{i}", f"unknown QoS class {name!r}")
        if qos not in rows:
            rows.append(qos)
    return sorted(rows, key=lambda q: -q.priority)


def list_teams(*, db: Session, principal: Principal) -> Sequence[Team]:
    return teams_repo.list_teams(db, principal.visible_team_ids())


def get_team(*, db: Session, principal: Principal, name: str, min_role: Role = Role.VIEWER) -> Team:
    return require_team(principal, teams_repo.get_by_name(db, name), name, min_role)


def create_team(
    *,
    db: Session,
    principal: Principal,
    name: str,
    quotas: Sequence[Quota] = (),
    cohort: str | None = None,
    fair_share_weight: float = 1.0,
    gpu_hour_budget: float | None = None,
    budget_period_s: int = 30 * 86400,
    qos_classes: Sequence[str] | None = None,
    restart_limit: int = DEFAULT_RESTART_LIMIT,
    fit: FitSettings = FitSettings(),
) -> Team:
    """``qos_classes``: the classes the team may use (default ``DEFAULT_TEAM_QOS``)."""
    require_admin(principal, "creating a team")
    if teams_repo.get_by_name(db, name) is not None:
        raise Conflict(f"team {name!r} already exists")
    team = Team(
        name=name,
        cohort=cohort,
        fair_share_weight=fair_share_weight,
        gpu_hour_budget=gpu_hour_budget,
        budget_period_s=budget_period_s,
        restart_limit=restart_limit,
        quotas=_quota_rows(db, quotas, fit),
        qos_classes=_qos_classes(db, DEFAULT_TEAM_QOS if qos_classes is None else qos_classes),
    )
    db.add(team)
    db.flush()
    qos = qos_repo.get_by_name(db, DEFAULT_QOS)
    if qos is not None:
        db.add(SlaContract(team_id=team.id, job_id=None, qos_class_id=qos.id))
    record_event(db, EventType.TEAM_CREATED, team_id=team.id, actor_user_id=principal.user_id, message=f"team {name}")
    return team


def update_team(
    *,
    db: Session,
    principal: Principal,
    name: str,
    changes: Mapping[str, Any],
    if_version: int | None = None,
    fit: FitSettings = FitSettings(),
) -> Team:
    """Admins change quotas, cohort, weight, budget, the QoS classes and the restart limit; ``quotas`` and
    ``qos_classes``, when given, replace the whole list. ``if_version``: only if the team is still at that
    version (``If-Match``), so that two admins editing at once do not lose an update."""
    team = get_team(db=db, principal=principal, name=name)
    require_admin(principal, "changing a team's quotas, cohort, weight, budget, QoS classes or restart limit")
    if not teams_repo.bump_version(db, team, expected=if_version):
        raise PreconditionFailed.stale(f"team {name!r}", if_version, team.version)
    for key in TEAM_FIELDS:
        if key in changes:
            setattr(team, key, changes[key])
    if changes.get("qos_classes") is not None:
        team.qos_classes = _qos_classes(db, changes["qos_classes"])
    if changes.get("quotas") is not None:
        team.quotas.clear()
        db.flush()  # delete the old rows before inserting new ones with the same (team, gpu_type)
        team.quotas.extend(_quota_rows(db, changes["quotas"], fit))
    record_event(
        db, EventType.TEAM_UPDATED, team_id=team.id, actor_user_id=principal.user_id, data={"fields": list(changes)}
    )
    return team


def delete_team(*, db: Session, principal: Principal, name: str) -> None:
    team = get_team(db=db, principal=principal, name=name)
    require_admin(principal, "deleting a team")
    if teams_repo.has_jobs(db, team.id):
        raise Conflict(f"team {name!r} has jobs; it cannot be deleted")
    db.delete(team)


def list_members(*, db: Session, principal: Principal, team: str) -> Sequence[tuple[Membership, str]]:
    t = get_team(db=db, principal=principal, name=team)
    return teams_repo.list_members(db, t.id)


def put_member(*, db: Session, principal: Principal, team: str, user: str, role: str) -> tuple[Membership, bool]:
    """Add ``user`` to ``team`` (admins) or change a member's role (team-admins too); returns (membership,
    created). A team-admin's request for someone not yet in the team is an invitation instead
    (``invitations.invite``): the router sends it there, so this answers NotFound for a non-member only to admins."""
    t = get_team(db=db, principal=principal, name=team, min_role=Role.TEAM_ADMIN)
    if role not in (Role.TEAM_ADMIN, Role.MEMBER, Role.VIEWER):
        raise InvalidInput.at("role", "must be one of team-admin, member, viewer")
    u = users_repo.get_by_name(db, user)
    membership = None if u is None else teams_repo.get_membership(db, team_id=t.id, user_id=u.id)
    if membership is None and not principal.is_admin:
        raise Forbidden(f"{user!r} is not in team {team!r}: a team-admin invites, and the user accepts")
    if u is None:
        raise NotFound(f"user {user!r} not found")
    created = membership is None
    if membership is None:
        membership = add_membership(db, team=t, user=u, role=role, actor_user_id=principal.user_id)
    elif membership.role != role:
        old = membership.role
        membership.role = role
        record_event(
            db,
            EventType.MEMBER_ROLE_CHANGED,
            team_id=t.id,
            actor_user_id=principal.user_id,
            message=f"{user} in {team}: {old} -> {role}",
            data={"user": user, "from": old, "role": role},
        )
    db.flush()
    return membership, created


def add_membership(
    db: Session, *, team: Team, user: User, role: str, actor_user_id: int, invited_by: str | None = None
) -> Membership:
    membership = Membership(user_id=user.id, team_id=team.id, role=role)
    db.add(membership)
    how = f" (invited by {invited_by})" if invited_by else ""
    record_event(
        db,
        EventType.MEMBER_ADDED,
        team_id=team.id,
        actor_user_id=actor_user_id,
        message=f"{user.name} joined {team.name} as {role}{how}",
        data={"user": user.name, "role": role, **({"invited_by": invited_by} if invited_by else {})},
    )
    return membership


def is_member(db: Session, *, team: Team, user: str) -> bool:
    u = users_repo.get_by_name(db, user)
    return u is not None and teams_repo.get_membership(db, team_id=team.id, user_id=u.id) is not None


def remove_member(*, db: Session, principal: Principal, team: str, user: str) -> None:
    t = get_team(db=db, principal=principal, name=team, min_role=Role.TEAM_ADMIN)
    u = users_repo.get_by_name(db, user)
    membership = None if u is None else teams_repo.get_membership(db, team_id=t.id, user_id=u.id)
    if u is None or membership is None:
        raise NotFound(f"user {user!r} is not a member of team {team!r}")
    db.delete(membership)
    record_event(
        db,
        EventType.MEMBER_REMOVED,
        team_id=t.id,
        actor_user_id=principal.user_id,
        message=f"{user} left {team}",
        data={"user": user, "role": membership.role},
    )
