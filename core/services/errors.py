"""Domain errors raised by services; the API maps them to problem+json (services know nothing of HTTP)."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """Base class; ``detail`` is safe to show to the caller."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotFound(ServiceError):
    """The thing does not exist, or the caller may not know that it does (no existence leak)."""


class Forbidden(ServiceError):
    """The caller can see the thing but its role does not allow the action."""


class Conflict(ServiceError):
    """The request clashes with the current state (duplicate name, job already finished...)."""


class PreconditionFailed(ServiceError):
    """The caller's ``If-Match`` names a version that is no longer current: someone else changed it first."""

    @classmethod
    def stale(cls, what: str, expected: int | None, current: int) -> PreconditionFailed:
        return cls(
            f"{what} changed since you read it (you sent version {expected}, it is at {current}): read it "
            "again and re-apply your change"
        )


class InvalidInput(ServiceError):
    """Semantically invalid input; ``errors`` carry field paths like ``sla.qos``."""

    def __init__(self, detail: str, errors: list[dict[str, Any]] | None = None):
        super().__init__(detail)
        self.errors = errors or []

    @classmethod
    def at(cls, loc: str, msg: str, type_: str = "value_error") -> InvalidInput:
        return cls(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": type_}])


class QueueFull(ServiceError):
    """The team has as many unfinished jobs as it may (``KILN_MAX_UNFINISHED_JOBS_PER_TEAM``): 429."""

    def __init__(self, team: str, unfinished: int, limit: int, adding: int = 1):
        more = f"; its {adding} jobs would make {unfinished + adding}" if adding > 1 else ""
        super().__init__(
            f"team {team!r} has {unfinished} unfinished jobs{more}, and a team may have {limit} at most "
            "(KILN_MAX_UNFINISHED_JOBS_PER_TEAM): wait for some to end, or cancel some"
        )
        self.team, self.unfinished, self.limit = team, unfinished, limit


class Unauthenticated(ServiceError):
    """No credentials, or credentials that are unknown, expired or revoked."""
