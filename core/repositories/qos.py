"""QoS classes."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import QosClass


def get_by_name(db: Session, name: str) -> QosClass | None:
    return db.scalars(select(QosClass).where(QosClass.name == name)).one_or_none()


def list_all(db: Session) -> Sequence[QosClass]:
    return db.scalars(select(QosClass).order_by(QosClass.priority.desc(), QosClass.name)).all()


def names_by_id(db: Session) -> dict[int, str]:
    return dict(db.execute(select(QosClass.id, QosClass.name)).tuples().all())
