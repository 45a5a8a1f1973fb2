"""Hosts and GPUs (readable by every authenticated caller: capacity is not tenant data)."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS, PAGE_DEFAULT, CursorQuery, LimitQuery, paged_query
from api.schemas.cluster import GpuOut, GpuPageOut, HostOut, HostPageOut
from core.services import cluster as svc

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=ERRORS)


@router.get("/hosts", response_model=HostPageOut, summary="Registered hosts, by name")
def list_hosts(
    db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> HostPageOut:
    rows, more = paged_query(partial(svc.hosts, db=db), lambda h: (h.name,), ("",), limit, cursor)
    return HostPageOut(
        next_cursor=more,
        items=[
            HostOut(
                id=h.id,
                name=h.name,
                queue=h.queue,
                state=h.state,
                cpu_slots=h.cpu_slots,
                gpu_count=len(h.gpus),
                excluded_until=h.excluded_until,
                exclusion_reason=h.exclusion_reason,
                links=h.links,
                mps=h.mps,
                isolation=h.isolation,
                isolation_note=h.isolation_note,
                last_heartbeat_at=h.last_heartbeat_at,
                registered_at=h.registered_at,
            )
            for h in rows
        ],
    )


@router.get("/gpus", response_model=GpuPageOut, summary="GPUs of every host, by host and index")
def list_gpus(
    db: SessionDep,
    who: CurrentPrincipal,
    host: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
    model: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
    limit: LimitQuery = PAGE_DEFAULT,
    cursor: CursorQuery = None,
) -> GpuPageOut:
    rows, more = paged_query(
        partial(svc.gpus, db=db, host=host, model=model), lambda g: (g[1], g[0].index), ("", 0), limit, cursor
    )
    return GpuPageOut(
        next_cursor=more,
        items=[
            GpuOut(
                uuid=g.uuid,
                host=host_name,
                index=g.index,
                model=g.model,
                memory_bytes=g.memory_bytes,
                mig_mode=g.mig_mode,
                pcie_gen=g.pcie_gen,
                nvlink_peers=g.nvlink_peers,
                healthy=g.healthy,
                last_sample=g.last_sample,
            )
            for g, host_name in rows
        ],
    )
