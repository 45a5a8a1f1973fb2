"""API tokens: issue (secret shown once), list, revoke."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.routers.common import ERRORS, LOCATION, PAGE_DEFAULT, CursorQuery, LimitQuery, paged_query
from api.schemas.common import INT64
from api.schemas.users import TokenCreate, TokenCreated, TokenOut, TokenPageOut
from core.db import utcnow
from core.models import ApiToken
from core.services import tokens as svc
from core.services.errors import InvalidInput

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=ERRORS)


def token_out(t: ApiToken) -> TokenOut:
    return TokenOut(
        id=t.id,
        name=t.name,
        prefix=t.prefix,
        user=t.user.name,
        scopes=list(t.scopes),
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked_at=t.revoked_at,
        last_used_at=t.last_used_at,
    )


@router.post(
    "", response_model=TokenCreated, status_code=status.HTTP_201_CREATED, summary="Issue a token", responses=LOCATION
)
def issue_token(
    body: TokenCreate, db: SessionDep, who: CurrentPrincipal, settings: SettingsDep, response: Response
) -> TokenCreated:
    if body.expires_at is not None and body.expires_in_s is not None:
        raise InvalidInput.at("expires_in_s", "give expires_at or expires_in_s, not both")
    expires_at = body.expires_at
    if body.expires_in_s is not None:
        expires_at = utcnow() + timedelta(seconds=body.expires_in_s)
    token, secret = svc.issue(
        db=db,
        principal=who,
        name=body.name,
        scopes=body.scopes,
        expires_at=expires_at,
        user=body.user,
        max_active=settings.max_tokens_per_user,
    )
    db.refresh(token)
    response.headers["Location"] = f"/v1/tokens/{token.id}"
    return TokenCreated(**token_out(token).model_dump(), secret=secret)


@router.get("", response_model=TokenPageOut, summary="Your tokens, oldest first (admins: ?user=)")
def list_tokens(
    db: SessionDep,
    who: CurrentPrincipal,
    user: Annotated[str | None, Query(max_length=64)] = None,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> TokenPageOut:
    rows, more = paged_query(
        partial(svc.list_tokens, db=db, principal=who, user=user), lambda t: (t.id,), (0,), limit, cursor
    )
    return TokenPageOut(items=[token_out(t) for t in rows], next_cursor=more)


@router.delete("/{token_id}", response_model=TokenOut, summary="Revoke a token")
def revoke_token(token_id: Annotated[int, Path(ge=1, le=INT64)], db: SessionDep, who: CurrentPrincipal) -> TokenOut:
    return token_out(svc.revoke(db=db, principal=who, token_id=token_id))
