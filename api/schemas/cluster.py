"""Hosts, GPUs and usage."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from api.schemas.common import NEXT_CURSOR_DOC, OutModel


class GpuOut(OutModel):
    uuid: str
    host: str
    index: int
    model: str
    memory_bytes: int
    mig_mode: bool
    pcie_gen: int | None
    nvlink_peers: list[Any]
    healthy: bool
    last_sample: dict[str, Any]


class HostOut(OutModel):
    id: int
    name: str
    queue: str
    state: str
    cpu_slots: int
    gpu_count: int
    excluded_until: datetime | None
    exclusion_reason: str | None
    links: dict[str, Any]
    mps: str | None = Field(
        None,
        description="its MPS daemon for fractional jobs: running, restarting, failed; "
        "null: none (no GPU, no binary, or KILN_MPS=off)",
    )
    isolation: str | None = Field(
        None,
        description="how its worker runs teams' code: sandbox; none (turned off by the operator: every job says so); "
        "unavailable (it cannot sandbox: it runs kiln's own recipes only); null: its worker has not said yet",
    )
    isolation_note: str | None = Field(None, description="how, or why not, in words")
    last_heartbeat_at: datetime | None
    registered_at: datetime


class CompileReuseOut(OutModel):
    """A team's compiles over the window and what its compile cache saved (from the trainer's COMPILE_* events)."""

    compiled: int = Field(description="attempts whose compile succeeded")
    hits: int = Field(description="of those, the ones whose compiled code came from a cache")
    hit_rate: float | None = Field(description="hits / compiled (null: nothing compiled)")
    saved_s: float = Field(description="seconds the hits saved against their entries' cold compiles")
    rejected: int = Field(description="cache entries refused (failed their check) before compiling")


class TeamUsageOut(OutModel):
    team: str
    budget_gpu_hours: float | None
    used_gpu_hours: float
    remaining_gpu_hours: float | None
    by_gpu_type: dict[str, float]
    compile_cache: CompileReuseOut | None = Field(None, description="the compile cache's reuse over the window")


class ForecastErrorOut(OutModel):
    """How far kiln's forecasts of one kind, by one source, were from what the jobs then measured. An error is
    ``actual - predicted`` in ``unit``; percentiles are nearest-rank over the forecasts that were measured."""

    kind: str = Field(description="start_time, peak_memory (per rank), step_time, gpu_hours")
    source: str = Field(description="who forecast it: scheduler, submit, trainer, or an estimate's own name")
    unit: str = Field(description="s, bytes or GPU-hours (a start: seconds)")
    forecasts: int = Field(description="forecasts made for the teams' jobs in the window")
    unknown: int = Field(description="of those, the ones kiln said cannot be known")
    measured: int = Field(description="with a forecast and a measured value: the errors are over these")
    median_abs_error: float | None
    p90_abs_error: float | None
    median_error: float | None = Field(description="signed: positive when later, bigger or slower than forecast")
    median_rel_error: float | None = Field(description="|error| / measured, a share (null for start times)")
    p90_rel_error: float | None
    in_range: int | None = Field(description="starts between their earliest and latest (null for other kinds)")


class UsageOut(OutModel):
    since: datetime
    until: datetime
    teams: list[TeamUsageOut]
    forecasts: list[ForecastErrorOut] = Field(
        default_factory=list, description="the errors of the forecasts made for these teams' jobs in the window"
    )


class HostPageOut(OutModel):
    items: list[HostOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)


class GpuPageOut(OutModel):
    items: list[GpuOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
