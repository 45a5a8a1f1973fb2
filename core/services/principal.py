"""Who is calling, and the tenancy rules every service applies.

Members see and act only within their teams; a team (or a job) of another team is reported as not found, so
its existence does not leak; viewers read only; team-admins manage their team; admins (with the ``admin``
scope on the token) see and do everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from core.models import Role, Team
from core.services.errors import Forbidden, NotFound

ROLE_RANK: Mapping[str, int] = {Role.VIEWER: 1, Role.MEMBER: 2, Role.TEAM_ADMIN: 3}
# ``metrics``: scrape /metrics and nothing else (for Prometheus); only an admin grants it.
SCOPES = ("read", "write", "admin", "metrics")


@dataclass(frozen=True)
class Principal:
    user_id: int
    name: str
    user_is_admin: bool = False
    scopes: frozenset[str] = frozenset({"read", "write"})
    token_id: int | None = None
    roles: Mapping[int, str] = field(default_factory=dict)  # team_id -> role
    token_expires_at: datetime | None = None  # the calling token's own expiry: no token it mints outlives it

    @property
    def is_admin(self) -> bool:
        """Global admin powers need both the user flag and a token carrying the ``admin`` scope."""
        return self.user_is_admin and "admin" in self.scopes

    def can_see(self, team_id: int) -> bool:
        return self.is_admin or team_id in self.roles

    def visible_team_ids(self) -> list[int] | None:
        """None means every team (admin)."""
        return None if self.is_admin else list(self.roles)


def require_admin(principal: Principal, action: str) -> None:
    if not principal.is_admin:
        raise Forbidden(f"{action} needs an admin (and a token with the 'admin' scope)")


def require_team(principal: Principal, team: Team | None, name: str, min_role: Role = Role.VIEWER) -> Team:
    """The team if the caller may act on it with ``min_role``; NotFound when it may not even see it."""
    require_team_id(principal, team.id if team is not None else None, name, min_role)
    assert team is not None
    return team


def require_team_id(principal: Principal, team_id: int | None, name: str, min_role: Role = Role.VIEWER) -> int:
    """``require_team`` for callers that looked up only the team's id (``None``: no such team)."""
    if team_id is None or not principal.can_see(team_id):
        raise NotFound(f"team {name!r} not found")
    if principal.is_admin:
        return team_id
    role = principal.roles[team_id]
    if ROLE_RANK[role] < ROLE_RANK[min_role]:
        raise Forbidden(f"your role in team {name!r} is {role}; this needs {min_role.value} or above")
    return team_id
