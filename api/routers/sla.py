"""SLA contracts: a team's default, and a job's effective contract."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS, ETAG, IfMatchHeader, JobIdPath, TeamPath, etag, if_match_version
from api.schemas.sla import SlaIn, SlaOut
from core.models import SlaContract
from core.services import sla as svc

router = APIRouter(prefix="/v1", tags=["sla"], responses=ERRORS)


def sla_out(c: SlaContract, team: str, standing: dict[str, svc.Standing] | None = None) -> SlaOut:
    return SlaOut(
        standing=standing,
        team=team,
        job_id=c.job_id,
        qos=c.qos_class.name,
        max_queue_wait_s=c.max_queue_wait_s,
        deadline=c.deadline,
        max_restarts=c.max_restarts,
        recovery_time_objective_s=c.recovery_time_objective_s,
        checkpoint_interval_s=c.checkpoint_interval_s,
        min_checkpoint_success_rate=c.min_checkpoint_success_rate,
        step_time_tolerance=c.step_time_tolerance,
        updated_at=c.updated_at,
    )


@router.get("/teams/{team}/sla", response_model=SlaOut, summary="The team's default contract", responses=ETAG)
def get_team_sla(team: TeamPath, db: SessionDep, who: CurrentPrincipal, response: Response) -> SlaOut:
    contract = svc.get_team_default(db=db, principal=who, team=team)
    response.headers["ETag"] = etag("sla", contract.version)
    return sla_out(contract, team)


@router.put(
    "/teams/{team}/sla", response_model=SlaOut, summary="Set the team's default contract (team-admin)", responses=ETAG
)
def put_team_sla(
    team: TeamPath,
    body: SlaIn,
    db: SessionDep,
    who: CurrentPrincipal,
    response: Response,
    if_match: IfMatchHeader = None,
) -> SlaOut:
    version = if_match_version(if_match, "sla")
    contract = svc.put_team_default(db=db, principal=who, team=team, terms=body.model_dump(), if_version=version)
    response.headers["ETag"] = etag("sla", contract.version)
    return sla_out(contract, team)


@router.get("/jobs/{job_id}/sla", response_model=SlaOut, summary="A job's effective contract")
def get_job_sla(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal) -> SlaOut:
    contract, team, standing = svc.get_job_contract(db=db, principal=who, job_id=job_id)
    return sla_out(contract, team, standing)
