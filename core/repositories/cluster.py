"""Hosts and GPUs as registered by the workers' host agents."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import GPU, Host


def list_hosts(db: Session) -> Sequence[Host]:
    return db.scalars(select(Host).order_by(Host.name)).all()


def list_gpus(db: Session, *, host: str | None = None, model: str | None = None) -> Sequence[tuple[GPU, str]]:
    stmt = select(GPU, Host.name).join(Host, Host.id == GPU.host_id)
    if host is not None:
        stmt = stmt.where(Host.name == host)
    if model is not None:
        stmt = stmt.where(GPU.model == model)
    return db.execute(stmt.order_by(Host.name, GPU.index)).tuples().all()
