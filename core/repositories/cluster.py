"""Hosts and GPUs as registered by the workers' host agents."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

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
