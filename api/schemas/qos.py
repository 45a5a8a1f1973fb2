"""QoS classes."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from api.schemas.common import INT32, NEXT_CURSOR_DOC, InModel, Int64, OutModel, Seconds, Text


class QosOut(OutModel):
    name: str
    priority: int = Field(description="Higher runs first.")
    preemptible: bool
    gpu_memory_cap_bytes: int | None
    sm_percent: int
    pcie_bandwidth_bytes_per_s: int | None
    nvlink_bandwidth_bytes_per_s: int | None
    default_max_queue_wait_s: float | None
    description: str


class QosUpdate(InModel):
    """Only the fields sent change (admins)."""

    priority: Annotated[int, Field(ge=-INT32, le=INT32)] | None = None
    preemptible: bool | None = None
    gpu_memory_cap_bytes: Int64 | None = None
    sm_percent: Annotated[int, Field(ge=1, le=100)] | None = None
    pcie_bandwidth_bytes_per_s: Int64 | None = None
    nvlink_bandwidth_bytes_per_s: Int64 | None = None
    default_max_queue_wait_s: Seconds | None = None
    description: Text | None = None

    model_config = InModel.model_config | {"json_schema_extra": {"examples": [{"priority": 1200, "sm_percent": 80}]}}


class QosPageOut(OutModel):
    items: list[QosOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR_DOC)
