"""Joining a team takes the user's consent or an admin's: a team-admin invites, the user accepts or declines.

An invitation is addressed by user name and answered the same whether or not such a user exists, so a
team-admin learns nothing about which names exist; it expires after ``INVITATION_TTL``. An admin adds members
directly (``teams.put_member``); a team-admin changes the role of someone already in the team directly too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from core.db import utcnow
from core.event_types import EventType
from core.models import Membership, Role, Team, TeamInvitation
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.services import teams as teams_svc
from core.services.errors import InvalidInput, NotFound
from core.services.principal import Principal
from core.transitions import record_event

INVITATION_TTL = timedelta(days=7)
ROLES = (Role.TEAM_ADMIN, Role.MEMBER, Role.VIEWER)


@dataclass(frozen=True)
class MemberChange:
    status: str  # "added" (by an admin), "updated" (a member's role), "invited" (waits for the user)
    role: str
    created_at: datetime
    expires_at: datetime | None = None


def put_member_or_invite(*, db: Session, principal: Principal, team: str, user: str, role: str) -> MemberChange:
    """``PUT /v1/teams/{team}/members/{user}``: an admin adds or changes; a team-admin changes a member's role,
    or invites someone who is not in the team (whether or not the name exists)."""
    t = teams_svc.get_team(db=db, principal=principal, name=team, min_role=Role.TEAM_ADMIN)
    if principal.is_admin or teams_svc.is_member(db, team=t, user=user):
        membership, created = teams_svc.put_member(db=db, principal=principal, team=team, user=user, role=role)
        return MemberChange("added" if created else "updated", membership.role, membership.created_at)
    invitation = invite(db, principal=principal, team=t, user=user, role=role)
    return MemberChange("invited", invitation.role, invitation.created_at, invitation.expires_at)


def invite(db: Session, *, principal: Principal, team: Team, user: str, role: str) -> TeamInvitation:
    if role not in ROLES:
        raise InvalidInput.at("role", "must be one of team-admin, member, viewer")
    now = utcnow()
    invitation = teams_repo.get_invitation(db, team_id=team.id, user_name=user)
    if invitation is None:
        invitation = TeamInvitation(team_id=team.id, user_name=user)
        db.add(invitation)
    invitation.role = role
    invitation.invited_by_user_id = principal.user_id
    invitation.created_at = now
    invitation.expires_at = now + INVITATION_TTL
    record_event(
        db,
        EventType.MEMBER_INVITED,
        team_id=team.id,
        actor_user_id=principal.user_id,
        message=f"{principal.name} invited {user} to {team.name} as {role}",
        data={"user": user, "role": role},
    )
    db.flush()
    return invitation


def team_invitations(*, db: Session, principal: Principal, team: str) -> Sequence[TeamInvitation]:
    t = teams_svc.get_team(db=db, principal=principal, name=team, min_role=Role.TEAM_ADMIN)
    return teams_repo.invitations_of_team(db, t.id, utcnow())


def withdraw(*, db: Session, principal: Principal, team: str, user: str) -> None:
    t = teams_svc.get_team(db=db, principal=principal, name=team, min_role=Role.TEAM_ADMIN)
    invitation = teams_repo.get_invitation(db, team_id=t.id, user_name=user)
    if invitation is None:
        raise NotFound(f"no invitation of {user!r} to team {team!r}")
    db.delete(invitation)


def my_invitations(*, db: Session, principal: Principal) -> Sequence[TeamInvitation]:
    return teams_repo.invitations_for_user(db, principal.name, utcnow())


def _mine(db: Session, principal: Principal, team: str) -> TeamInvitation:
    """The caller's live invitation to ``team``; NotFound otherwise (the team's existence is not confirmed)."""
    team_id = teams_repo.id_by_name(db, team)
    invitation = None if team_id is None else teams_repo.get_invitation(db, team_id=team_id, user_name=principal.name)
    if invitation is None or invitation.expires_at <= utcnow():
        raise NotFound(f"no invitation to team {team!r}")
    return invitation


def accept(*, db: Session, principal: Principal, team: str) -> Membership:
    invitation = _mine(db, principal, team)
    user = users_repo.get_by_id(db, principal.user_id)
    assert user is not None
    membership = teams_repo.get_membership(db, team_id=invitation.team_id, user_id=user.id)
    if membership is None:
        inviter = users_repo.names_by_id(db, [invitation.invited_by_user_id]).get(invitation.invited_by_user_id or 0)
        membership = teams_svc.add_membership(
            db, team=invitation.team, user=user, role=invitation.role, actor_user_id=user.id, invited_by=inviter
        )
    db.delete(invitation)
    db.flush()
    return membership


def decline(*, db: Session, principal: Principal, team: str) -> None:
    invitation = _mine(db, principal, team)
    record_event(
        db,
        EventType.INVITATION_DECLINED,
        team_id=invitation.team_id,
        actor_user_id=principal.user_id,
        message=f"{principal.name} declined to join {team}",
        data={"user": principal.name},
    )
    db.delete(invitation)
