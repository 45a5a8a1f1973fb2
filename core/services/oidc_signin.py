"""What a checked ID token makes of a kiln user: found by (issuer, subject), created on first sign-in, its teams,
roles and admin flag set from the provider's groups (``KILN_OIDC_GROUP_MAP``), and a kiln token issued for it.

Only what sign-in granted is taken away by sign-in (``Membership.from_sso``): a membership an admin added in kiln
stays. A user name already held by a local user is refused rather than taken over (the provider would otherwise
decide who 'admin' is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.event_types import EventType
from core.models import ApiToken, Membership, User
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.services import tokens as tokens_svc
from core.services.errors import Conflict, Unauthenticated
from core.services.oidc import session_lifetime
from core.services.principal import ROLE_RANK, Principal
from core.settings import OidcSettings
from core.transitions import record_event

NAME_OK = re.compile(r"[^A-Za-z0-9._@-]")


@dataclass(frozen=True)
class Grants:
    admin: bool = False
    teams: dict[str, str] = field(default_factory=dict)  # team name -> role


def grants_for(settings: OidcSettings, groups: list[str]) -> Grants:
    """What the user's groups grant; the highest role wins where two groups name the same team."""
    admin, teams = False, dict[str, str]()
    for group in groups:
        for grant in (g.strip() for g in settings.oidc_group_map.get(group, "").split(",")):
            if grant == "admin":
                admin = True
            elif ":" in grant:
                team, role = grant.split(":", 1)
                if ROLE_RANK.get(role, 0) > ROLE_RANK.get(teams.get(team, ""), 0):
                    teams[team] = role
    return Grants(admin=admin, teams=teams)


def groups_of(settings: OidcSettings, claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.oidc_groups_claim) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise Unauthenticated(f"the ID token's {settings.oidc_groups_claim!r} claim is not a list")
    return [str(g) for g in value]


def user_name(settings: OidcSettings, claims: dict[str, Any]) -> str:
    email = claims.get("email")
    local_part = email.split("@")[0] if isinstance(email, str) else None
    for value in (claims.get(settings.oidc_username_claim), local_part, claims.get("sub")):
        if isinstance(value, str) and value.strip():
            return NAME_OK.sub("-", value.strip())[:64]
    raise Unauthenticated("the ID token names no user")


def sign_in(
    *, db: Session, settings: OidcSettings, claims: dict[str, Any], max_active: int | None, client: str
) -> tuple[ApiToken, str, User, Grants]:
    """The user behind ``claims`` (made on first sign-in), their grants set from their groups now, and a new
    kiln token for them (``client``: 'dashboard' or 'cli', its name)."""
    grants = grants_for(settings, groups_of(settings, claims))
    user = _user(db, settings, claims)
    changes = _apply(db, user, grants)
    said = f" ({'; '.join(changes)})" if changes else ""
    message = f"{user.name} signed in with {claims['iss']}{said}"
    record_event(
        db, EventType.SSO_SIGN_IN, actor_user_id=user.id, message=message, data={"user_id": user.id, "changes": changes}
    )
    scopes = ["read", "write"] + (["admin"] if user.is_admin else [])
    me = Principal(user_id=user.id, name=user.name, user_is_admin=user.is_admin, scopes=frozenset(scopes))
    expires_at = utcnow() + session_lifetime(settings)
    token, secret = tokens_svc.issue(
        db=db, principal=me, name=f"sso-{client}", scopes=scopes, expires_at=expires_at, max_active=max_active
    )
    return token, secret, user, grants


def _user(db: Session, settings: OidcSettings, claims: dict[str, Any]) -> User:
    issuer, subject = str(claims["iss"]), str(claims["sub"])
    # Locked: two sign-ins of one user at once would otherwise both add the same membership.
    user = db.scalar(select(User).where(User.oidc_issuer == issuer, User.oidc_subject == subject).with_for_update())
    if user is not None:
        db.refresh(user, ["memberships"])
        return user
    name = user_name(settings, claims)
    if users_repo.get_by_name(db, name) is not None:
        raise Conflict(
            f"the user name {name!r} belongs to a kiln user who does not sign in with {issuer}; "
            "an admin may rename one of them"
        )
    email = claims.get("email")
    user = User(name=name, email=email if isinstance(email, str) else None, oidc_issuer=issuer, oidc_subject=subject)
    db.add(user)
    db.flush()
    return user


def _apply(db: Session, user: User, grants: Grants) -> list[str]:
    """Set the user's admin flag and sign-in memberships to ``grants``; what changed, in words."""
    changes: list[str] = []
    if user.is_admin != grants.admin:
        user.is_admin = grants.admin
        changes.append("admin granted" if grants.admin else "admin removed")
    held = {m.team.name: m for m in user.memberships}
    for name, membership in held.items():
        if membership.from_sso and name not in grants.teams:
            user.memberships.remove(membership)
            changes.append(f"left {name}")
    for name, role in grants.teams.items():
        current = held.get(name)
        if current is not None and not current.from_sso:
            continue  # added in kiln by hand: not the provider's to change
        if current is not None:
            if current.role != role:
                changes.append(f"{name}: {current.role} -> {role}")
                current.role = role
            continue
        team = teams_repo.get_by_name(db, name)
        if team is None:
            changes.append(f"team {name} (mapped) does not exist")
            continue
        user.memberships.append(Membership(team_id=team.id, role=role, from_sso=True))
        changes.append(f"joined {name} as {role}")
    db.flush()
    return changes
