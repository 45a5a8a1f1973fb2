"""QoS classes: everyone reads them; admins edit them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from core.models import QosClass
from core.repositories import qos as qos_repo
from core.services.errors import NotFound
from core.services.principal import Principal, require_admin

EDITABLE = (
    "priority",
    "preemptible",
    "gpu_memory_cap_bytes",
    "sm_percent",
    "pcie_bandwidth_bytes_per_s",
    "nvlink_bandwidth_bytes_per_s",
    "default_max_queue_wait_s",
    "description",
)


def list_classes(*, db: Session) -> Sequence[QosClass]:
    return qos_repo.list_all(db)


def get_class(*, db: Session, name: str) -> QosClass:
    qos = qos_repo.get_by_name(db, name)
    if qos is None:
        raise NotFound(f"QoS class {name!r} not found")
    return qos


def update_class(*, db: Session, principal: Principal, name: str, changes: Mapping[str, Any]) -> QosClass:
    require_admin(principal, "editing a QoS class")
    qos = get_class(db=db, name=name)
    for key in EDITABLE:
        if key in changes:
            setattr(qos, key, changes[key])
    db.flush()
    return qos
