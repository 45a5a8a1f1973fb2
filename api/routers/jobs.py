"""Jobs: submit (JSON or YAML), list (filters + keyset pages), get, change, cancel, hold and release, and what hangs
off a job."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from pydantic import Field
from sqlalchemy.orm import Session

from api import sse
from api.auth import principal_for
from api.deps import (
    CurrentPrincipal,
    SessionDep,
    SessionFactoryDep,
    SettingsDep,
    StorageDirDep,
    StreamPrincipal,
    autocommit,
    finish,
    run_hot,
)
from api.job_bodies import SUBMIT_BODY, CancelIn, HoldIn, idempotency_of, spec_from_body
from api.logstream import parse_position, sse_log_stream, tail_offset
from api.routers.common import (
    ERRORS,
    LOCATION,
    PAGE_DEFAULT,
    USER_PATTERN,
    CursorQuery,
    JobIdPath,
    LastEventIdQuery,
    LimitQuery,
    StreamTicketQuery,
    decode_cursor,
    encode_cursor,
    paged_query,
)
from api.schemas.common import INT32, INT64, InModel, OutModel
from api.schemas.jobs import (
    AttemptCompileOut,
    AttemptOut,
    AttemptPageOut,
    CheckpointAdviceOut,
    CheckpointOut,
    CheckpointPageOut,
    EventOut,
    EventPageOut,
    JobDetailOut,
    JobForecastOut,
    JobOut,
    JobPageOut,
    MetricOut,
    MetricsOut,
    WhyOut,
    job_detail_json,
    job_json,
    page_json,
)
from core.forecast_errors import KINDS
from core.models import Forecast
from core.services import compile_cache, forecasts
from core.services import jobs as svc
from core.services.checkpoint_advice import CheckpointAdvice
from core.services.fit import FitSettings
from core.spec import NAME_PATTERN, JobSpec
from core.states import TERMINAL, JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERRORS)


# One Server-Sent Event: `log` (a line; id = "<attempt>:<byte offset after it>"), `attempt` (switched to a
# restart's log), `end` (data: {"attempt": N, "state": "..."}, or {"reason": "unauthorized"}).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["log", "attempt", "end"]},
        "data": {"type": "string"},
        "id": {"type": "string"},
    },
    "required": ["event", "data"],
}


class JSONBytes(Response):
    """Already-serialized JSON (the model was dumped once by pydantic-core, skipping response revalidation)."""

    media_type = "application/json"


@router.post(
    "",
    response_model=JobOut,
    status_code=status.HTTP_201_CREATED,
    summary="Submit a job (JSON or YAML spec)",
    openapi_extra=SUBMIT_BODY,
    responses=LOCATION,
)
async def submit_job(
    request: Request,
    db: SessionDep,
    hold: Annotated[bool, Query(description="Submit the job held: it waits until POST /v1/jobs/{id}/release")] = False,
) -> Response:
    # The hot path: the spec validated from the body bytes on the event loop (no thread hop, no dependency of its
    # own), then authentication, the submission, the commit and the JSON in one worker thread (one hop); the
    # answer built once from what was written (no read-back, no response-model revalidation).
    spec = await spec_from_body(request)
    return await run_hot(_submit, request, db, spec, await idempotency_of(request), hold)


def _submit(request: Request, db: Session, spec: JobSpec, idempotency: svc.Idempotency | None, hold: bool) -> Response:
    autocommit(db)
    who = principal_for(request, db)
    replayed = False
    settings = request.app.state.settings
    cap, fit = settings.max_unfinished_jobs_per_team, FitSettings.of(settings)
    if idempotency is None:
        view = svc.submit(db=db, principal=who, spec=spec, hold=hold, max_unfinished=cap, fit=fit)
    else:
        view, replayed = svc.submit_once(
            db=db, principal=who, spec=spec, idempotency=idempotency, hold=hold, max_unfinished=cap, fit=fit
        )
    finish(db)
    headers = {"Location": f"/v1/jobs/{view.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONBytes(job_json(view), status_code=status.HTTP_201_CREATED, headers=headers)


@router.get("", response_model=JobPageOut, summary="Jobs you can see, newest first")
async def list_jobs(
    db: SessionDep,
    request: Request,
    team: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=64)] = None,
    state: Annotated[list[JobState] | None, Query(description="Repeatable")] = None,
    qos: Annotated[str | None, Query(max_length=32, pattern=r"^[a-z0-9-]+$")] = None,
    name: Annotated[str | None, Query(max_length=64, pattern=NAME_PATTERN)] = None,
    user: Annotated[str | None, Query(pattern=USER_PATTERN, description="Only jobs this user submitted")] = None,
    submitted_after: Annotated[
        datetime | None, Query(description="Only jobs submitted at or after this time (RFC 3339; no zone: UTC)")
    ] = None,
    submitted_before: Annotated[
        datetime | None, Query(description="Only jobs submitted before this time (RFC 3339; no zone: UTC)")
    ] = None,
    held: Annotated[bool | None, Query(description="Only held jobs (true) or only those not held (false)")] = None,
    sweep: Annotated[int | None, Query(ge=1, le=INT64, description="Only this sweep's jobs")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    states = [s.value for s in state or ()]
    window = (submitted_after, submitted_before)
    return await run_hot(_list, request, db, team, states, qos, name, user, window, held, sweep, limit, cursor)


def _list(
    request: Request,
    db: Session,
    team: str | None,
    states: list[str],
    qos: str | None,
    name: str | None,
    user: str | None,
    window: tuple[datetime | None, datetime | None],
    held: bool | None,
    sweep: int | None,
    limit: int,
    cursor: str | None,
) -> Response:
    autocommit(db)
    who = principal_for(request, db)  # in this thread: one hop for the whole request (see submit)
    page = svc.list_jobs(
        db=db,
        principal=who,
        team=team,
        states=states,
        qos=qos,
        name=name,
        user=user,
        limit=limit,
        before_id=decode_cursor(cursor, "before") if cursor else None,
        submitted_after=window[0],
        submitted_before=window[1],
        held=held,
        sweep=sweep,
    )
    next_cursor = encode_cursor("before", page.next_before_id) if page.next_before_id else None
    finish(db)
    return JSONBytes(page_json(page.items, next_cursor, utc=page.utc))


@router.get("/{job_id}", response_model=JobDetailOut, summary="One job, with its checkpoint advice and forecasts")
def get_job(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    view = svc.get(db=db, principal=who, job_id=job_id)
    advice = _advice_out(svc.checkpoint_advice(db=db, principal=who, job_id=job_id))
    said = [_forecast_out(f) for f in forecasts.of_job(db, job_id=job_id)]
    return JSONBytes(job_detail_json(view, advice, said))


def _forecast_out(f: Forecast) -> JobForecastOut:
    return JobForecastOut(
        kind=f.kind,
        source=f.source,
        unit=KINDS.get(f.kind, ""),
        predicted=f.predicted,
        predicted_high=f.predicted_high,
        actual=f.actual,
        note=f.note,
        made_at=f.made_at,
        settled_at=f.settled_at,
    )


def _advice_out(a: CheckpointAdvice | None) -> CheckpointAdviceOut | None:
    if a is None:
        return None
    r = a.rate
    return CheckpointAdviceOut(
        summary=a.summary,
        advised_interval_s=a.advised_s,
        chosen_interval_s=a.chosen_s,
        checkpoint_cost_s=a.cost_s,
        checkpoint_cost_measured=a.cost_measured,
        gpu_type=r.gpu_type,
        mtbf_h=r.mtbf_h,
        failures=r.failures,
        host_hours=r.host_hours,
        from_prior=r.from_prior,
        hosts=a.hosts,
        expected_loss_gpu_h=a.loss_gpu_h,
        advised_expected_loss_gpu_h=a.advised_loss_gpu_h,
    )


@router.post("/{job_id}/cancel", response_model=JobOut, status_code=status.HTTP_202_ACCEPTED, summary="Cancel a job")
def cancel_job(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal, body: CancelIn = CancelIn()) -> Response:
    # The body is optional (no body = no reason) and typed as the model, not ``CancelIn | None``: generated clients
    # cannot build a request body that is "a CancelIn or null".
    view = svc.cancel(db=db, principal=who, job_id=job_id, reason=body.reason)
    return JSONBytes(job_json(view), status_code=status.HTTP_202_ACCEPTED)


@router.post("/{job_id}/hold", response_model=JobOut, summary="Hold a queued job: it does not start until released")
def hold_job(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal, body: HoldIn = HoldIn()) -> Response:
    # Holding a held job answers the job as it is (the hold is a state, not an action to repeat).
    return JSONBytes(job_json(svc.hold(db=db, principal=who, job_id=job_id, reason=body.reason)))


@router.post("/{job_id}/release", response_model=JobOut, summary="Release a held job: the scheduler plans it again")
def release_job(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal) -> Response:
    return JSONBytes(job_json(svc.release(db=db, principal=who, job_id=job_id)))


class JobUpdateIn(InModel):
    """What may change of a job (Slurm's scontrol update); a field left out stays as it is. A queued job: any (its
    GPUs until it has a checkpoint; dependencies that close no cycle); a running one: its time limit (lowered by a
    member; raised or removed by a team admin or an admin)."""

    qos: Annotated[
        str | None,
        Field(
            max_length=32,
            pattern=r"^[a-z0-9-]+$",
            description="A QoS class the team may use; the priority and the contract follow it",
        ),
    ] = None
    time_limit_s: Annotated[
        float | None,
        Field(
            gt=0,
            le=30 * 86400,
            description=(
                "Seconds; null: no limit. A running job's counts every attempt's run; its worker follows a change "
                "at its next heartbeat"
            ),
        ),
    ] = None
    gpus: Annotated[
        int | None,
        Field(ge=0, le=4096, description="Total GPUs (0: CPU slots only); a queued job that has no checkpoint yet"),
    ] = None
    depends_on: Annotated[
        list[Annotated[str, Field(max_length=40)]] | None,
        Field(
            max_length=32,
            description=(
                "The jobs it waits for, as a spec writes them (JOB, afterok:JOB, afterany:JOB, afternotok:JOB), "
                "instead of those it has; []: none"
            ),
        ),
    ] = None


@router.patch("/{job_id}", response_model=JobOut, summary="Change a job (Slurm's scontrol update)")
def update_job(
    job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal, body: JobUpdateIn, settings: SettingsDep
) -> Response:
    limit = body.time_limit_s if "time_limit_s" in body.model_fields_set else svc.UNCHANGED
    job = svc.update(
        db=db,
        principal=who,
        job_id=job_id,
        qos=body.qos,
        time_limit_s=limit,
        gpus=body.gpus,
        depends_on=body.depends_on,
        fit=FitSettings.of(settings),
    )
    return JSONBytes(job_json(job))


@router.get("/{job_id}/events", response_model=EventPageOut, summary="The job's timeline, oldest first")
def list_job_events(
    job_id: JobIdPath,
    db: SessionDep,
    who: CurrentPrincipal,
    after: Annotated[
        int, Query(ge=0, le=INT64, description="Only events with a larger id (for polling; cursor= pages the same way)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many items on the page (1..1000)")] = 100,
    cursor: CursorQuery = None,
) -> EventPageOut:
    after_id = decode_cursor(cursor, "after") if cursor else after
    rows = svc.events(db=db, principal=who, job_id=job_id, after_id=after_id, limit=limit + 1)
    items = [
        EventOut(
            id=e.id, job_id=e.job_id, type=e.type, message=e.message, data=e.data, actor=actor, created_at=e.created_at
        )
        for e, actor in rows[:limit]
    ]
    more = encode_cursor("after", items[-1].id) if len(rows) > limit else None
    return EventPageOut(items=items, next_after=items[-1].id if items else None, next_cursor=more)


@router.get(
    "/{job_id}/logs",
    response_class=StreamingResponse,
    summary="The attempt's log as Server-Sent Events (resumable with Last-Event-ID; ?ticket= for EventSource)",
    responses={200: {"content": {"text/event-stream": {"schema": SSE_EVENT}}}},
)
def stream_job_logs(
    job_id: JobIdPath,
    request: Request,
    db: SessionDep,
    who: StreamPrincipal,
    storage: StorageDirDep,
    sessions: SessionFactoryDep,
    attempt: Annotated[int | None, Query(ge=1, le=INT32, description="Default: the latest")] = None,
    follow: Annotated[bool, Query(description="Tail until the job is terminal")] = False,
    tail: Annotated[int | None, Query(ge=0, le=1_000_000, description="Begin with the last N lines only")] = None,
    ticket: StreamTicketQuery = None,
    last_event_id: LastEventIdQuery = None,
) -> StreamingResponse:
    target = svc.log_target(db=db, principal=who, job_id=job_id, storage_dir=storage, attempt=attempt)
    guard = sse.Guard(request, sessions, who, target.team_id)
    resume = parse_position(sse.last_event_id(request))
    if resume is None and tail is not None and target.attempt is not None:
        resume = (target.attempt, tail_offset(target.path, tail))
    stream = sse_log_stream(
        request=request,
        target=target,
        follow=follow,
        sessions=sessions,
        storage_dir=storage,
        pinned=attempt is not None,
        guard=guard,
        resume=resume,
    )
    return StreamingResponse(stream, media_type="text/event-stream", headers=sse.HEADERS)


@router.get("/{job_id}/metrics", response_model=MetricsOut, summary="Training telemetry, downsampled")
def get_job_metrics(
    job_id: JobIdPath,
    db: SessionDep,
    who: CurrentPrincipal,
    after_step: Annotated[int, Query(ge=-1, le=INT64)] = -1,
    max_points: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> MetricsOut:
    rows = svc.metrics(db=db, principal=who, job_id=job_id, after_step=after_step, max_points=max_points)
    return MetricsOut(job_id=job_id, items=[MetricOut.model_validate(m) for m in rows])


@router.get("/{job_id}/attempts", response_model=AttemptPageOut, summary="The job's attempts, first first")
def list_job_attempts(
    job_id: JobIdPath,
    db: SessionDep,
    who: CurrentPrincipal,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> AttemptPageOut:
    rows, more = paged_query(
        partial(svc.attempts, db=db, principal=who, job_id=job_id), lambda a: (a.number,), (0,), limit, cursor
    )
    compiles = compile_cache.for_attempts(db, principal=who, job_id=job_id, attempts=rows)
    items = [
        AttemptOut.model_validate(a).model_copy(update={"compile": AttemptCompileOut.model_validate(c)})
        for a, c in zip(rows, compiles, strict=True)
    ]
    return AttemptPageOut(items=items, next_cursor=more)


@router.get("/{job_id}/checkpoints", response_model=CheckpointPageOut, summary="The job's checkpoints, by step")
def list_job_checkpoints(
    job_id: JobIdPath,
    db: SessionDep,
    who: CurrentPrincipal,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> CheckpointPageOut:
    rows, more = paged_query(
        partial(svc.checkpoints, db=db, principal=who, job_id=job_id), lambda c: (c.step,), (0,), limit, cursor
    )
    return CheckpointPageOut(items=[CheckpointOut.model_validate(c) for c in rows], next_cursor=more)


class CodeOut(OutModel):
    """The team's own code a job runs (spec ``code``) and its last evaluation."""

    digest: str | None
    entry_point: str | None
    download: str | None = Field(description="The archive (GET, .tar.gz)")
    evaluation: dict[str, Any] | None = Field(description="{step, metrics: {name: value}}, or null before the first")


@router.get("/{job_id}/code", response_model=CodeOut, summary="The job's own code and its last evaluation")
def code(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal) -> CodeOut:
    found = svc.code(db=db, principal=who, job_id=job_id)
    return CodeOut(
        digest=found.digest,
        entry_point=found.entry_point,
        download=f"/v1/teams/{found.team}/artifacts/{found.digest}/archive" if found.digest else None,
        evaluation=found.evaluation,
    )


@router.get("/{job_id}/why", response_model=WhyOut, summary="Why the job is (not) running, and what would let it start")
def get_job_pending_reason(job_id: JobIdPath, db: SessionDep, who: CurrentPrincipal, request: Request) -> WhyOut:
    why = svc.why(db=db, principal=who, job_id=job_id, forecaster=request.app.state.forecaster)
    job, forecast = why.job, why.forecast
    return WhyOut(
        state=JobState(job.state),
        pending_reason=job.pending_reason,
        pending_message=job.pending_message,
        unblock=why.unblock,
        expected_start=forecast.earliest if forecast else None,
        expected_start_latest=forecast.latest if forecast else None,
        expected_start_hosts=list(forecast.hosts) if forecast else [],
        expected_start_basis=forecast.basis if forecast else None,
        exit_reason=job.exit_reason if job.state in TERMINAL else None,
    )
