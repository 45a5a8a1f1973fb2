"""GPU-hours per team and GPU type, against each team's budget."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS
from api.schemas.cluster import UsageOut
from api.schemas.common import UTCDatetime
from core.services import usage as svc
from core.spec import NAME_PATTERN

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=ERRORS)


@router.get("", response_model=UsageOut, summary="GPU-hours per team and GPU type (default: the last 30 days)")
def get_usage(
    db: SessionDep,
    who: CurrentPrincipal,
    team: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=64)] = None,
    since: Annotated[UTCDatetime | None, Query()] = None,
    until: Annotated[UTCDatetime | None, Query()] = None,
) -> UsageOut:
    return UsageOut.model_validate(svc.report(db=db, principal=who, team=team, since=since, until=until))
