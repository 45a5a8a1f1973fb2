"""Hosts and GPUs as registered by the workers' host agents."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.host_fit import HostCapacity
from core.models import GPU, Host
from core.repositories.keyset import Window, page


def list_hosts(db: Session, window: Window | None = None) -> Sequence[Host]:
    return db.scalars(page(select(Host), [(Host.name, False)], window)).all()


def list_gpus(
    db: Session, *, host: str | None = None, model: str | None = None, window: Window | None = None
) -> Sequence[tuple[GPU, str]]:
    stmt = select(GPU, Host.name).join(Host, Host.id == GPU.host_id)
    if host is not None:
        stmt = stmt.where(Host.name == host)
    if model is not None:
        stmt = stmt.where(GPU.model == model)
    return db.execute(page(stmt, [(Host.name, False), (GPU.index, False)], window)).tuples().all()


def gpu_types(db: Session) -> dict[str, int]:
    """Each GPU type the hosts have registered, with the memory of its largest GPU (bytes)."""
    stmt = select(GPU.model, func.max(GPU.memory_bytes)).group_by(GPU.model).order_by(GPU.model)
    return {model: int(memory) for model, memory in db.execute(stmt).tuples()}


def capacity(db: Session) -> list[HostCapacity]:
    """What each host has for ``core.host_fit``: its GPUs the scheduler may place on (healthy, not in MIG mode, as
    its snapshot counts them) by type, and its CPU slots. One statement."""
    usable = (GPU.host_id == Host.id) & GPU.healthy & GPU.mig_mode.is_(False)
    stmt = (
        select(Host.id, Host.cpu_slots, GPU.model, func.count(GPU.id))
        .outerjoin(GPU, usable)
        .group_by(Host.id, Host.cpu_slots, GPU.model)
        .order_by(Host.id)
    )
    hosts: dict[int, tuple[int, list[tuple[str, int]]]] = {}
    for host_id, cpu_slots, model, count in db.execute(stmt).tuples():
        _, gpus = hosts.setdefault(host_id, (cpu_slots, []))
        if model is not None:
            gpus.append((model, int(count)))
    return [HostCapacity(tuple(gpus), cpu_slots) for cpu_slots, gpus in hosts.values()]
