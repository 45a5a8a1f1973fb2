"""The caller (``/v1/me``) and admin-only user management."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Response, status

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS, LOCATION, PAGE_DEFAULT, CursorQuery, LimitQuery, TeamPath, paged, paged_query
from api.routers.teams import invitation_out
from api.schemas.teams import InvitationPageOut, MemberOut
from api.schemas.users import TeamRole, UserCreate, UserOut, UserPageOut
from core.models import User
from core.services import invitations
from core.services import users as svc

router = APIRouter(prefix="/v1", tags=["users"], responses=ERRORS)


def user_out(user: User) -> UserOut:
    teams = sorted((TeamRole(team=m.team.name, role=m.role) for m in user.memberships), key=lambda t: t.team)
    return UserOut(
        id=user.id, name=user.name, email=user.email, is_admin=user.is_admin, created_at=user.created_at, teams=teams
    )


@router.get("/me", response_model=UserOut, summary="Who the token belongs to, and their teams")
def get_me(db: SessionDep, who: CurrentPrincipal) -> UserOut:
    return user_out(svc.me(db=db, principal=who))


@router.get("/users", response_model=UserPageOut, summary="All users, by name (admin)")
def list_users(
    db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> UserPageOut:
    rows, more = paged_query(partial(svc.list_users, db=db, principal=who), lambda u: (u.name,), ("",), limit, cursor)
    return UserPageOut(items=[user_out(u) for u in rows], next_cursor=more)


@router.post("/users", response_model=UserOut, status_code=status.HTTP_201_CREATED, summary="Create a user (admin)")
def create_user(body: UserCreate, db: SessionDep, who: CurrentPrincipal) -> UserOut:
    user = svc.create_user(db=db, principal=who, name=body.name, email=body.email, is_admin=body.is_admin)
    db.refresh(user)
    return user_out(user)


@router.get("/me/invitations", response_model=InvitationPageOut, summary="Teams that invited you")
def list_my_invitations(
    db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> InvitationPageOut:
    rows, more = paged(invitations.my_invitations(db=db, principal=who), lambda i: (i.team_id,), limit, cursor)
    return InvitationPageOut(items=[invitation_out(db, i) for i in rows], next_cursor=more)


@router.post(
    "/me/invitations/{team}/accept",
    response_model=MemberOut,
    status_code=status.HTTP_201_CREATED,
    summary="Join a team that invited you",
    responses=LOCATION,
)
def accept_invitation(team: TeamPath, db: SessionDep, who: CurrentPrincipal, response: Response) -> MemberOut:
    m = invitations.accept(db=db, principal=who, team=team)
    response.headers["Location"] = f"/v1/teams/{team}/members/{who.name}"
    return MemberOut(team=team, user=who.name, role=m.role, created_at=m.created_at)


@router.post("/me/invitations/{team}/decline", status_code=status.HTTP_204_NO_CONTENT, summary="Decline")
def decline_invitation(team: TeamPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    invitations.decline(db=db, principal=who, team=team)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
