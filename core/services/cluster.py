"""The cluster as the workers registered it: hosts and GPUs (readable by every authenticated caller)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from core.models import GPU, Host
from core.repositories import cluster as cluster_repo


def hosts(*, db: Session) -> Sequence[Host]:
    return cluster_repo.list_hosts(db)


def gpus(*, db: Session, host: str | None = None, model: str | None = None) -> Sequence[tuple[GPU, str]]:
    return cluster_repo.list_gpus(db, host=host, model=model)
