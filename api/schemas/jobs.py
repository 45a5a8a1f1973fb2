"""Jobs and their timeline, attempts, checkpoints, metrics."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema
from pydantic_core import to_json

from api.schemas.common import NEXT_CURSOR_DOC, OutModel
from core.services.jobs import JobView
from core.states import JobState

# The spec is served as stored (the validated spec, defaults filled in), without a second validation; the
# document shows it as the JobSpec component that POST /v1/jobs reads (api.openapi points this field there).
StoredSpec = Annotated[dict[str, Any], Field(description="The validated spec, defaults filled in.")]


# An event's data: free-form per event type; a state change carries the states it moved between.
EventData = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "description": "Details by event type; a state change (type = the new state) has `from` and `to`.",
            "properties": {
                "from": {"$ref": "#/components/schemas/JobState"},
                "to": {"$ref": "#/components/schemas/JobState"},
            },
            "additionalProperties": True,
        }
    ),
]

JOB_EXAMPLE: dict[str, Any] = {
    "id": 42,
    "name": "gpt-tiny",
    "team": "default",
    "user": "admin",
    "state": JobState.QUEUED.value,
    "qos": "silver",
    "priority": 500,
    "gpus": 0,
    "gpu_type": "cpu",
    "pending_reason": None,
    "pending_message": None,
    "restart_count": 0,
    "last_step": 0,
    "last_loss": None,
    "steps": 60,
    "exit_reason": None,
    "cancel_requested": False,
    "submitted_at": "2026-11-29T09:30:00.123456Z",
    "admitted_at": None,
    "started_at": None,
    "finished_at": None,
    "queued_s": 0.0,
    "waiting_since": "2026-11-29T09:30:00.123456Z",
    "held_at": None,
    "spec": {"name": "gpt-tiny", "team": "default", "recipe": {"name": "gpt", "hyperparameters": {}}, "steps": 60},
}


class JobOut(OutModel):
    id: int
    name: str
    team: str
    user: str | None
    state: JobState
    qos: str
    priority: int
    gpus: int
    gpu_type: str | None = Field(description="'cpu' for CPU-slot jobs (gpus == 0); None = any GPU type.")
    pending_reason: str | None
    pending_message: str | None
    restart_count: int
    last_step: int
    last_loss: float | None
    steps: int = Field(description="Total steps, from the spec.")
    exit_reason: str | None
    cancel_requested: bool
    submitted_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    queued_s: float = Field(
        description="Seconds in the queue in the waits that ended: the first and every requeue after a preemption, "
        "a drain or a lost host (a restart backoff and held time excluded); the queue-wait SLA counts these and "
        "the current wait."
    )
    waiting_since: datetime | None = Field(
        description="When the wait the job is in began (QUEUED only; null otherwise): its wait so far is queued_s "
        "+ (now - waiting_since). Null while the job is held."
    )
    held_at: datetime | None = Field(
        description="Held since (POST /v1/jobs/{id}/hold; pending_reason Held): it does not start until released. "
        "Its wait is paused meanwhile: the queue-wait SLA counts no held time. On a running job: a hold was asked; "
        "it stops (checkpoint first) and comes back to the queue held."
    )
    spec: StoredSpec

    model_config = OutModel.model_config | {"json_schema_extra": {"examples": [JOB_EXAMPLE]}}


# A job's answer is built as bytes, once, from a ``JobView``: the fields other than ``spec`` dumped by pydantic-core
# (as ``JobOut.model_dump_json`` would: ISO datetimes, NaN as null) and the spec spliced in as the JSON text it
# already is (the submission serialized it for the write; the database hands it back as text). ``spec`` is
# JobOut's last field, so the document has JobOut's field order.
_FIELDS = JobView._fields[:-1]
_DATETIMES = ("submitted_at", "admitted_at", "started_at", "finished_at", "waiting_since", "held_at")
assert (*_FIELDS, "spec") == tuple(JobOut.model_fields), "JobView must follow JobOut's fields"


def _document(view: JobView, utc: bool) -> bytes:
    """``utc=False``: the view's datetimes are in another zone (PostgreSQL's session zone), converted first."""
    fields: dict[str, Any] = dict(zip(_FIELDS, view, strict=False))  # the view's last field is the spec
    if not utc:
        for key in _DATETIMES:
            if fields[key] is not None:
                fields[key] = fields[key].astimezone(UTC)
    return to_json(fields, inf_nan_mode="null")[:-1] + b',"spec":' + view.spec_json.encode() + b"}"


def job_json(view: JobView) -> bytes:
    """One ``JobOut`` document."""
    return _document(view, utc=False)


def page_json(items: Sequence[JobView], next_cursor: str | None, *, utc: bool = True) -> bytes:
    """A ``JobPageOut`` document; ``utc``: the page's datetimes are UTC already (no conversion per row)."""
    parts = b",".join(_document(view, utc) for view in items)
    return b'{"items":[' + parts + b'],"next_cursor":' + to_json(next_cursor) + b"}"


class CheckpointAdviceOut(OutModel):
    """How often the job should checkpoint, by Young/Daly from what kiln measured (core.services.checkpoint_advice)."""

    summary: str = Field(
        examples=[
            "checkpoint every 200 steps (~6 min); advised ~18 min (~587 steps) (Young/Daly: "
            "save 4.1 s, MTBF 38 h on H200 from 3 failure(s) in 114 host-hours); expected loss "
            "0.9 vs 0.6 GPU-h"
        ]
    )
    advised_interval_s: float = Field(description="Seconds of training between checkpoints (Daly's optimum).")
    chosen_interval_s: float | None = Field(description="The job's own, where its step time is measured.")
    checkpoint_cost_s: float = Field(description="What one checkpoint costs the job (its save's stall).")
    checkpoint_cost_measured: bool = Field(description="False: predicted from the checkpoint's size.")
    gpu_type: str
    mtbf_h: float = Field(description="A busy host's mean time between infrastructure failures, this GPU type.")
    failures: int
    host_hours: float
    from_prior: bool = Field(description="Fewer than 3 failures seen: a prior of one in 6,000 host-hours weighs in.")
    hosts: int
    expected_loss_gpu_h: float | None = Field(description="Over its remaining steps, at its interval.")
    advised_expected_loss_gpu_h: float | None = Field(description="The same, at the advised interval.")


class JobForecastOut(OutModel):
    """What kiln forecast for the job, and what then happened (docs/scheduler.md, "Forecasts held to account")."""

    kind: str = Field(description="start_time, peak_memory (per rank), step_time, gpu_hours")
    source: str = Field(description="who forecast it: scheduler, submit, trainer, estimate")
    unit: str = Field(description="s (a start: seconds after made_at), bytes or GPU-hours")
    predicted: float | None = Field(description="Null: kiln said it cannot be known (note says why).")
    predicted_high: float | None = Field(description="The top of a range (a start's latest).")
    actual: float | None = Field(description="As measured; null until settled, or if it never happened.")
    note: str | None
    made_at: datetime
    settled_at: datetime | None


class JobDetailOut(JobOut):
    checkpoint_advice: CheckpointAdviceOut | None = Field(
        default=None, description="Null for an ended job, or before its first checkpoint."
    )
    forecasts: list[JobForecastOut] = Field(default_factory=list, description="Its forecasts, first of each kind.")


def job_detail_json(view: JobView, advice: CheckpointAdviceOut | None, forecasts: Sequence[JobForecastOut]) -> bytes:
    """One ``JobDetailOut`` document: the job's, then its checkpoint advice and its forecasts."""
    extra = advice.model_dump_json().encode() if advice is not None else b"null"
    said = b",".join(f.model_dump_json().encode() for f in forecasts)
    return job_json(view)[:-1] + b',"checkpoint_advice":' + extra + b',"forecasts":[' + said + b"]}"


class JobPageOut(OutModel):
    items: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; None = last page.")


class EventOut(OutModel):
    id: int
    job_id: int | None
    type: str = Field(examples=["SUBMITTED"])
    message: str
    data: EventData
    actor: str | None
    created_at: datetime


class EventPageOut(OutModel):
    items: list[EventOut]
    next_after: int | None = Field(description="Pass as ?after= to read on; None when no more events now.")
    next_cursor: str | None = Field(default=None, description=NEXT_CURSOR_DOC)


class CacheRejectionOut(OutModel):
    reason: str = Field(description="why the trainer refused the entry, e.g. numeric_mismatch, digest_mismatch")
    key: str | None = Field(description="the refused entry's cache key")
    source: str | None = Field(description="where the refused entry came from: local, team or shared (null: not said)")


class AttemptCompileOut(OutModel):
    """An attempt's compile and what the compile cache gave it (from the trainer's COMPILE_* events)."""

    status: str = Field(
        description="hit, miss, fallback (compiled, then fell back to eager), off (no compile: turned off, a script, "
        "or the attempt ended before compiling), pending (not compiled yet)"
    )
    source: str | None = Field(
        description="a hit's source: local (this host's compiler caches), team (the team's cache in kiln's "
        "storage), shared (a cache an admin published for every team)"
    )
    key: str | None = Field(description="the cache key: a digest of everything that decides the compiled code")
    compile_s: float | None = Field(description="compile time in seconds, loading the cache included")
    load_s: float | None = Field(description="seconds spent loading the cache entry")
    saved_s: float | None = Field(
        description="a hit's seconds saved against the cold compile recorded with the entry (null: not said)"
    )
    published: bool = Field(description="this attempt's compile was published to the team's cache")
    rejections: list[CacheRejectionOut] = Field(description="cache entries refused before compiling")
    fallback: str | None = Field(description="the fallback's event type when status is fallback")
    summary: str = Field(description="in words, as kiln describe says it: hit (team cache, key 3f9a1c2e) 0.4 s, ...")


class AttemptOut(OutModel):
    id: int
    number: int
    state: str
    placement: list[Any]
    created_at: datetime
    started_at: datetime | None
    heartbeat_at: datetime | None
    first_step_at: datetime | None
    resumed_from_step: int | None
    ended_at: datetime | None
    exit_code: int | None
    exit_reason: str | None
    compile: AttemptCompileOut | None = None


class CheckpointOut(OutModel):
    id: int
    attempt_id: int | None
    step: int
    path: str
    bytes: int
    sha256: str
    verified: bool
    created_at: datetime


class MetricOut(OutModel):
    step: int
    ts: datetime
    attempt_id: int | None
    loss: float | None
    grad_norm: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    mfu: float | None
    mem_peak_bytes: int | None
    extra: dict[str, Any]


class MetricsOut(OutModel):
    job_id: int
    items: list[MetricOut]


class WhyOut(OutModel):
    state: JobState
    pending_reason: str | None = Field(
        description="The scheduler's reason: Quota, Budget, Resources, Unschedulable, Priority, Dependency, "
        "BandwidthQuota, MemoryFit, Reservation.",
        examples=["Quota"],
    )
    pending_message: str | None = Field(examples=["team default: 4/4 cpu slots in use"])
    unblock: list[str] = Field(
        description="What would let it start (fewer GPUs, another GPU type or class, the team's quota...).",
        examples=[["fewer GPUs: the whole cluster has 2 H200 GPUs"]],
    )
    expected_start: datetime | None = Field(
        default=None,
        description="The earliest it would start: the scheduler's own plan() run forward from now, running jobs "
        "ending by their measured progress, else as kiln expects them to use their time limits. Null when that "
        "cannot be known (expected_start_basis says why); never given together with 'cannot be known'.",
    )
    expected_start_latest: datetime | None = Field(
        default=None,
        description="The latest it would start, as the queue stands: running jobs ending at their time limits (plus "
        "the scheduler's grace), or their measured progress at a slower pace. Null exactly when expected_start is.",
    )
    expected_start_hosts: list[str] = Field(
        default_factory=list, description="Where it would start (the earliest projection's hosts)."
    )
    exit_reason: str | None = Field(
        default=None,
        description="Why a finished job ended (FAILED, CANCELLED, LOST): a cancel's reason and who gave it, the "
        "error of a failure. Null for a job that has not finished, or that succeeded.",
        examples=["cancelled by mark: wrong lr"],
    )
    expected_start_basis: str | None = Field(
        default=None,
        description="How expected_start is known, or why it cannot be (null when the job is not queued).",
        examples=[
            "cannot be known: it starts only after running job(s) 3 end, which have no time limit "
            "(time_limit_s) and report no progress yet; kiln does not guess how long a job runs"
        ],
    )


class AttemptPageOut(OutModel):
    items: list[AttemptOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


class CheckpointPageOut(OutModel):
    items: list[CheckpointOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
