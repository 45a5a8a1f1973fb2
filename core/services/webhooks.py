"""Webhooks: create (the secret is shown once), list, delete, send a test, read the delivery log.

A team's hooks (every job of the team) are its team-admins' to manage; a job's own hooks, any member's of the
job's team. A caller who may not manage a hook is told it does not exist, as for jobs and teams.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.event_types import EventType
from core.models import Job, Role, Webhook, WebhookDelivery
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.repositories.keyset import Window, page
from core.services.errors import InvalidInput, NotFound
from core.services.principal import ROLE_RANK, Principal, require_team_id
from core.webhook_kinds import KINDS, SWEEP_KIND
from core.webhooks import FORMATS, TEST_KIND, target_refusal

MAX_HOOKS_PER_TEAM = 50


@dataclass(frozen=True)
class NewWebhook:
    hook: Webhook
    team: str
    secret: str


def _min_role(hook_job_id: int | None) -> Role:
    return Role.MEMBER if hook_job_id is not None else Role.TEAM_ADMIN


def create(
    *,
    db: Session,
    principal: Principal,
    team: str | None,
    job_id: int | None,
    url: str,
    events: Sequence[str],
    fmt: str = "json",
    description: str = "",
    allow_private: bool = False,
) -> NewWebhook:
    """A hook on ``job_id`` (its team's members) or on every job of ``team`` (team-admins)."""
    team_id, team_name = _scope(db, principal, team=team, job_id=job_id)
    unknown = sorted(set(events) - set(KINDS))
    if unknown or not events:
        raise InvalidInput.at(
            "events",
            f"unknown event kinds {unknown}; choose from {', '.join(KINDS)}"
            if unknown
            else f"name at least one of {', '.join(KINDS)}",
        )
    if job_id is not None and SWEEP_KIND in events:
        raise InvalidInput.at("events", f"{SWEEP_KIND} is heard by a team's hooks (--team), not by a hook on one job")
    if fmt not in FORMATS:
        raise InvalidInput.at("format", f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    refusal = target_refusal(url, allow_private=allow_private)
    if refusal is not None:
        raise InvalidInput.at("url", refusal)
    count = len(db.scalars(select(Webhook.id).where(Webhook.team_id == team_id)).all())
    if count >= MAX_HOOKS_PER_TEAM:
        raise InvalidInput.at(
            "team",
            f"team {team_name!r} already has {count} webhooks (the most is {MAX_HOOKS_PER_TEAM}); delete one first",
        )
    secret = "whsec_" + secrets.token_urlsafe(32)
    hook = Webhook(
        team_id=team_id,
        job_id=job_id,
        url=url,
        secret=secret,
        events=sorted(set(events), key=KINDS.index),
        format=fmt,
        description=description,
        created_by_user_id=principal.user_id,
        created_at=utcnow(),
    )
    db.add(hook)
    db.flush()
    return NewWebhook(hook=hook, team=team_name, secret=secret)


def _scope(db: Session, principal: Principal, *, team: str | None, job_id: int | None) -> tuple[int, str]:
    """The team a hook (to be) lives in, once the caller's right to manage it is checked."""
    if job_id is not None:
        job = jobs_repo.get(db, job_id)
        if job is None or not principal.can_see(job.team_id):
            raise NotFound(f"job {job_id} not found")
        name = teams_repo.names_by_id(db, [job.team_id]).get(job.team_id, "?")
        if team is not None and team != name:
            raise InvalidInput.at("team", f"job {job_id} is in team {name!r}, not {team!r}")
        require_team_id(principal, job.team_id, name, Role.MEMBER)
        return job.team_id, name
    if team is None:
        raise InvalidInput.at("team", "name a team (every job of it) or a job")
    team_id = require_team_id(principal, teams_repo.id_by_name(db, team), team, Role.TEAM_ADMIN)
    return team_id, team


def list_hooks(
    *, db: Session, principal: Principal, team: str | None = None, job_id: int | None = None
) -> list[tuple[Webhook, str]]:
    """Hooks the caller manages: of a team (its hooks and its jobs' hooks), of one job, or everywhere."""
    stmt = select(Webhook).order_by(Webhook.id)
    if job_id is not None:
        _scope(db, principal, team=team, job_id=job_id)
        stmt = stmt.where(Webhook.job_id == job_id)
    elif team is not None:
        team_id = require_team_id(principal, teams_repo.id_by_name(db, team), team, Role.MEMBER)
        stmt = stmt.where(Webhook.team_id == team_id)
    else:
        visible = principal.visible_team_ids()
        if visible is not None:
            stmt = stmt.where(Webhook.team_id.in_(visible))
    hooks = [h for h in db.scalars(stmt).all() if _may_manage(principal, h)]
    names = teams_repo.names_by_id(db, sorted({h.team_id for h in hooks}))
    return [(h, names.get(h.team_id, "?")) for h in hooks]


def _may_manage(principal: Principal, hook: Webhook) -> bool:
    if principal.is_admin:
        return True
    role = principal.roles.get(hook.team_id)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[_min_role(hook.job_id)]


def get(*, db: Session, principal: Principal, hook_id: int) -> tuple[Webhook, str]:
    hook = db.get(Webhook, hook_id)
    if hook is None or not principal.can_see(hook.team_id):
        raise NotFound(f"webhook {hook_id} not found")
    name = teams_repo.names_by_id(db, [hook.team_id]).get(hook.team_id, "?")
    require_team_id(principal, hook.team_id, name, _min_role(hook.job_id))
    return hook, name


def delete(*, db: Session, principal: Principal, hook_id: int) -> None:
    hook, _ = get(db=db, principal=principal, hook_id=hook_id)
    db.delete(hook)
    db.flush()


def send_test(*, db: Session, principal: Principal, hook_id: int) -> WebhookDelivery:
    """Queue a ``test`` delivery behind the hook's others (the notifier sends it, signed like any other)."""
    hook, team = get(db=db, principal=principal, hook_id=hook_id)
    now = utcnow()
    job = db.get(Job, hook.job_id) if hook.job_id is not None else None
    payload = {
        "kind": TEST_KIND,
        "event": {
            "type": EventType.TEST,
            "message": f"test delivery requested by {principal.name}",
            "created_at": now.isoformat(),
        },
        "job": {"id": job.id, "name": job.name, "team": team, "state": job.state}
        if job is not None
        else {"id": None, "name": None, "team": team, "state": None},
    }
    delivery = WebhookDelivery(webhook_id=hook.id, kind=TEST_KIND, payload=payload, created_at=now, next_attempt_at=now)
    db.add(delivery)
    db.flush()
    return delivery


def deliveries(
    *, db: Session, principal: Principal, hook_id: int, window: Window | None = None
) -> list[WebhookDelivery]:
    """The delivery log, newest first."""
    get(db=db, principal=principal, hook_id=hook_id)
    stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id)
    return list(db.scalars(page(stmt, [(WebhookDelivery.id, True)], window)).all())
