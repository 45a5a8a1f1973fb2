"""GPU-hours per team and GPU type over a window, against each team's budget; and how far kiln's forecasts for
those teams' jobs were from what happened (``core.services.forecasts``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from core.db import utcnow
from core.forecast_errors import ErrorSummary
from core.repositories import teams as teams_repo
from core.repositories import usage as usage_repo
from core.services import compile_cache, forecasts
from core.services.compile_cache import TeamReuse
from core.services.errors import InvalidInput
from core.services.principal import Principal, require_team

DEFAULT_WINDOW = timedelta(days=30)


@dataclass
class TeamUsage:
    team: str
    budget_gpu_hours: float | None
    used_gpu_hours: float = 0.0
    by_gpu_type: dict[str, float] = field(default_factory=dict)
    compile_cache: TeamReuse | None = None

    @property
    def remaining_gpu_hours(self) -> float | None:
        return None if self.budget_gpu_hours is None else self.budget_gpu_hours - self.used_gpu_hours


@dataclass(frozen=True)
class UsageReport:
    since: datetime
    until: datetime
    teams: list[TeamUsage]
    forecasts: list[ErrorSummary]  # the forecasts made for these teams' jobs in the window, per kind and source


def report(
    *,
    db: Session,
    principal: Principal,
    team: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> UsageReport:
    until = until or utcnow()
    since = since or until - DEFAULT_WINDOW
    if since >= until:
        raise InvalidInput.at("since", "must be before until")
    if team is not None:
        teams = [require_team(principal, teams_repo.get_by_name(db, team), team)]
    else:
        teams = list(teams_repo.list_teams(db, principal.visible_team_ids()))
    out = {t.id: TeamUsage(team=t.name, budget_gpu_hours=t.gpu_hour_budget) for t in teams}
    rows = usage_repo.gpu_seconds_by_team_and_type(db, team_ids=list(out), since=since, until=until)
    for team_id, gpu_type, seconds in rows:
        entry = out[team_id]
        hours = seconds / 3600.0
        entry.by_gpu_type[gpu_type] = entry.by_gpu_type.get(gpu_type, 0.0) + hours
        entry.used_gpu_hours += hours
    reuse = compile_cache.by_team(db, teams={t.id: t.name for t in teams}, since=since, until=until)
    for team_id, entry in out.items():
        entry.compile_cache = reuse[team_id]
    errors = forecasts.summary(db, team_ids=list(out), since=since, until=until)
    return UsageReport(since=since, until=until, teams=list(out.values()), forecasts=errors)
