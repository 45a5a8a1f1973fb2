"""Teams (quotas with borrowing/lending, cohort, fair share, budget) and memberships."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.routers.common import (
    ERRORS,
    ETAG,
    LOCATION,
    PAGE_DEFAULT,
    CursorQuery,
    IfMatchHeader,
    LimitQuery,
    TeamPath,
    UserPath,
    etag,
    if_match_version,
    paged,
)
from api.schemas.teams import (
    InvitationOut,
    InvitationPageOut,
    MemberIn,
    MemberOut,
    MemberPageOut,
    QuotaIn,
    TeamCreate,
    TeamOut,
    TeamPageOut,
    TeamUpdate,
)
from core.models import Membership, TeamInvitation
from core.repositories import users as users_repo
from core.services import invitations
from core.services import teams as svc
from core.services.fit import FitSettings

router = APIRouter(prefix="/v1/teams", tags=["teams"], responses=ERRORS)


def _quotas(items: list[QuotaIn]) -> list[svc.Quota]:
    return [svc.Quota(**q.model_dump()) for q in items]


def _member(m: Membership, team: str, user: str) -> MemberOut:
    return MemberOut(team=team, user=user, role=m.role, created_at=m.created_at)


@router.get("", response_model=TeamPageOut, summary="Teams you can see, by name")
def list_teams(
    db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> TeamPageOut:
    rows, more = paged(svc.list_teams(db=db, principal=who), lambda t: (t.name,), limit, cursor)
    return TeamPageOut(items=[TeamOut.model_validate(t) for t in rows], next_cursor=more)


@router.post(
    "", response_model=TeamOut, status_code=status.HTTP_201_CREATED, summary="Create a team (admin)", responses=LOCATION
)
def create_team(
    body: TeamCreate, db: SessionDep, who: CurrentPrincipal, response: Response, settings: SettingsDep
) -> TeamOut:
    fields = body.model_dump(exclude={"quotas"})
    team = svc.create_team(db=db, principal=who, quotas=_quotas(body.quotas), fit=FitSettings.of(settings), **fields)
    response.headers["Location"] = f"/v1/teams/{team.name}"
    return TeamOut.model_validate(team)


@router.get("/{team}", response_model=TeamOut, summary="One team", responses=ETAG)
def get_team(team: TeamPath, db: SessionDep, who: CurrentPrincipal, response: Response) -> TeamOut:
    row = svc.get_team(db=db, principal=who, name=team)
    response.headers["ETag"] = etag("team", row.version)
    return TeamOut.model_validate(row)


@router.patch(
    "/{team}", response_model=TeamOut, summary="Change quotas, cohort, weight, budget (admin)", responses=ETAG
)
def update_team(
    team: TeamPath,
    body: TeamUpdate,
    db: SessionDep,
    who: CurrentPrincipal,
    response: Response,
    settings: SettingsDep,
    if_match: IfMatchHeader = None,
) -> TeamOut:
    changes = body.model_dump(exclude_unset=True, exclude={"quotas"})
    for key in ("fair_share_weight", "budget_period_s", "restart_limit", "qos_classes"):
        if changes.get(key, 0) is None:
            changes.pop(key)  # not nullable: an explicit null means "leave as is"
    if body.quotas is not None:
        changes["quotas"] = _quotas(body.quotas)
    version = if_match_version(if_match, "team")
    fit = FitSettings.of(settings)
    row = svc.update_team(db=db, principal=who, name=team, changes=changes, if_version=version, fit=fit)
    response.headers["ETag"] = etag("team", row.version)
    return TeamOut.model_validate(row)


@router.delete("/{team}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a team without jobs (admin)")
def delete_team(team: TeamPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    svc.delete_team(db=db, principal=who, name=team)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{team}/members", response_model=MemberPageOut, summary="Members and their roles, by user name")
def list_team_members(
    team: TeamPath, db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> MemberPageOut:
    rows, more = paged(svc.list_members(db=db, principal=who, team=team), lambda r: (r[1],), limit, cursor)
    return MemberPageOut(items=[_member(m, team, name) for m, name in rows], next_cursor=more)


@router.put(
    "/{team}/members/{user}",
    response_model=MemberOut,
    summary="Add a member (admin), change a member's role, or invite a user (team-admin)",
    responses={
        201: {"model": MemberOut, "description": "Added (admins)", **LOCATION[201]},
        202: {"model": MemberOut, "description": "Invited: the user joins by accepting"},
    },
)
def put_team_member(
    team: TeamPath, user: UserPath, body: MemberIn, db: SessionDep, who: CurrentPrincipal, response: Response
) -> MemberOut:
    change = invitations.put_member_or_invite(db=db, principal=who, team=team, user=user, role=body.role)
    response.status_code = {"added": 201, "invited": 202}.get(change.status, 200)
    if response.status_code == 201:
        response.headers["Location"] = f"/v1/teams/{team}/members/{user}"
    return MemberOut(
        team=team,
        user=user,
        role=change.role,
        created_at=change.created_at,
        status="invited" if change.status == "invited" else "member",
        expires_at=change.expires_at,
    )


def invitation_out(db: SessionDep, i: TeamInvitation) -> InvitationOut:
    inviter = users_repo.names_by_id(db, [i.invited_by_user_id]).get(i.invited_by_user_id or 0)
    return InvitationOut(
        team=i.team.name,
        user=i.user_name,
        role=i.role,
        invited_by=inviter,
        created_at=i.created_at,
        expires_at=i.expires_at,
    )


@router.get("/{team}/invitations", response_model=InvitationPageOut, summary="Pending invitations (team-admin)")
def list_team_invitations(
    team: TeamPath, db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> InvitationPageOut:
    found = invitations.team_invitations(db=db, principal=who, team=team)
    rows, more = paged(found, lambda i: (i.user_name,), limit, cursor)
    return InvitationPageOut(items=[invitation_out(db, i) for i in rows], next_cursor=more)


@router.delete("/{team}/invitations/{user}", status_code=status.HTTP_204_NO_CONTENT, summary="Withdraw an invitation")
def withdraw_invitation(team: TeamPath, user: UserPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    invitations.withdraw(db=db, principal=who, team=team, user=user)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete("/{team}/members/{user}", status_code=status.HTTP_204_NO_CONTENT, summary="Remove a member")
def remove_team_member(team: TeamPath, user: UserPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    svc.remove_member(db=db, principal=who, team=team, user=user)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
