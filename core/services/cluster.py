"""The cluster as the workers registered it: hosts and GPUs (readable by every authenticated caller)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from core.models import GPU, Host
from core.repositories import cluster as cluster_repo
from core.repositories.keyset import Window


def hosts(*, db: Session, window: Window | None = None) -> Sequence[Host]:
    return cluster_repo.list_hosts(db, window)


def gpus(
    *, db: Session, host: str | None = None, model: str | None = None, window: Window | None = None
) -> Sequence[tuple[GPU, str]]:
    return cluster_repo.list_gpus(db, host=host, model=model, window=window)
