"""Teams: quota used, borrowed and lent; GPU-hours against budget; fair share."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from core.db import utcnow
from core.services import capacity

router = APIRouter(tags=["dashboard"])


@router.get("/v1/dashboard/teams", summary="Quota used/borrowed/lent, GPU-hours against budget, fair share")
def teams_view(session: SessionDep, who: CurrentPrincipal, settings: SettingsDep) -> dict[str, Any]:
    """Fair share: usage decayed with the scheduler's half-life, as a share of all usage, against the weight's."""
    half_life_s = settings.policy.fairshare_half_life_s
    teams = capacity.team_capacity(session, who, now=utcnow(), half_life_s=half_life_s)
    out = [
        {
            "name": c.team.name,
            "cohort": c.team.cohort,
            "fair_share_weight": c.team.fair_share_weight,
            "weight_share": c.weight_share,
            "usage_share": c.usage_share,
            "gpu_hours": c.gpu_hours,
            "gpu_hour_budget": c.team.gpu_hour_budget,
            "budget_period_s": c.team.budget_period_s,
            "quotas": c.quotas,
            "waiting": c.waiting,
            "active": c.active,
        }
        for c in teams
    ]
    return {"teams": out, "fair_share_half_life_s": half_life_s}
