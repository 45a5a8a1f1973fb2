"""Webhooks: create (the signing secret is shown once), list, delete, send a test, read the delivery log."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.routers.common import (
    ERRORS,
    PAGE_DEFAULT,
    CursorQuery,
    LimitQuery,
    TeamQuery,
    paged,
    paged_query,
)
from api.schemas.common import INT64
from api.schemas.webhooks import DeliveryOut, DeliveryPageOut, WebhookCreate, WebhookCreated, WebhookOut, WebhookPageOut
from core.models import Webhook
from core.services import webhooks as svc

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=ERRORS)

HookPath = Annotated[int, Path(ge=1, le=INT64, description="Webhook id")]


def webhook_out(hook: Webhook, team: str) -> WebhookOut:
    return WebhookOut(
        id=hook.id,
        team=team,
        job_id=hook.job_id,
        url=hook.url,
        events=list(hook.events or []),
        format=hook.format,
        description=hook.description,
        created_at=hook.created_at,
    )


@router.post(
    "",
    response_model=WebhookCreated,
    status_code=status.HTTP_201_CREATED,
    summary="Create a webhook on a team's jobs (team-admin) or on one job (member)",
)
def create(
    body: WebhookCreate, db: SessionDep, who: CurrentPrincipal, settings: SettingsDep, response: Response
) -> WebhookCreated:
    new = svc.create(
        db=db,
        principal=who,
        team=body.team,
        job_id=body.job_id,
        url=body.url,
        events=body.events,
        fmt=body.format,
        description=body.description,
        allow_private=settings.webhook_allow_private_targets,
    )
    response.headers["Location"] = f"/v1/webhooks/{new.hook.id}"
    return WebhookCreated(**webhook_out(new.hook, new.team).model_dump(), secret=new.secret)


@router.get("", response_model=WebhookPageOut, summary="Webhooks you manage, oldest first")
def list_webhooks(
    db: SessionDep,
    who: CurrentPrincipal,
    team: TeamQuery = None,
    job_id: Annotated[int | None, Query(ge=1, le=INT64, description="Only this job's")] = None,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> WebhookPageOut:
    found = svc.list_hooks(db=db, principal=who, team=team, job_id=job_id)
    rows, more = paged(found, lambda r: (r[0].id,), limit, cursor)
    return WebhookPageOut(items=[webhook_out(h, t) for h, t in rows], next_cursor=more)


@router.get("/{hook_id}", response_model=WebhookOut, summary="One webhook")
def get_webhook(hook_id: HookPath, db: SessionDep, who: CurrentPrincipal) -> WebhookOut:
    return webhook_out(*svc.get(db=db, principal=who, hook_id=hook_id))


@router.delete("/{hook_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a webhook and its log")
def delete_webhook(hook_id: HookPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    svc.delete(db=db, principal=who, hook_id=hook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{hook_id}/test",
    response_model=DeliveryOut,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Queue a signed test delivery",
)
def test_webhook(hook_id: HookPath, db: SessionDep, who: CurrentPrincipal) -> DeliveryOut:
    return DeliveryOut.model_validate(svc.send_test(db=db, principal=who, hook_id=hook_id))


@router.get("/{hook_id}/deliveries", response_model=DeliveryPageOut, summary="The delivery log, newest first")
def list_deliveries(
    hook_id: HookPath,
    db: SessionDep,
    who: CurrentPrincipal,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> DeliveryPageOut:
    rows, more = paged_query(
        partial(svc.deliveries, db=db, principal=who, hook_id=hook_id), lambda d: (-d.id,), (0,), limit, cursor
    )
    return DeliveryPageOut(items=[DeliveryOut.model_validate(d) for d in rows], next_cursor=more)
