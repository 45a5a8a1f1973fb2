"""The caller (``/v1/me``) and admin-only user management."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS
from api.schemas.users import TeamRole, UserCreate, UserOut
from core.models import User
from core.services import users as svc

router = APIRouter(prefix="/v1", tags=["users"], responses=ERRORS)


def user_out(user: User) -> UserOut:
    teams = sorted((TeamRole(team=m.team.name, role=m.role) for m in user.memberships), key=lambda t: t.team)
    return UserOut(
        id=user.id, name=user.name, email=user.email, is_admin=user.is_admin, created_at=user.created_at, teams=teams
    )


@router.get("/me", response_model=UserOut, summary="Who the token belongs to, and their teams")
def me(db: SessionDep, who: CurrentPrincipal) -> UserOut:
    return user_out(svc.me(db=db, principal=who))


@router.get("/users", response_model=list[UserOut], summary="All users (admin)")
def list_users(db: SessionDep, who: CurrentPrincipal) -> list[UserOut]:
    return [user_out(u) for u in svc.list_users(db=db, principal=who)]


@router.post("/users", response_model=UserOut, status_code=status.HTTP_201_CREATED, summary="Create a user (admin)")
def create_user(body: UserCreate, db: SessionDep, who: CurrentPrincipal) -> UserOut:
    user = svc.create_user(db=db, principal=who, name=body.name, email=body.email, is_admin=body.is_admin)
    db.refresh(user)
    return user_out(user)
