"""QoS classes."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS, PAGE_DEFAULT, CursorQuery, LimitQuery, QosPath, paged
from api.schemas.qos import QosOut, QosPageOut, QosUpdate
from core.services import qos as svc

router = APIRouter(prefix="/v1/qos", tags=["qos"], responses=ERRORS)

NOT_NULL = ("priority", "preemptible", "sm_percent", "description")


@router.get("", response_model=QosPageOut, summary="QoS classes, highest priority first")
def list_qos_classes(
    db: SessionDep, who: CurrentPrincipal, limit: LimitQuery = PAGE_DEFAULT, cursor: CursorQuery = None
) -> QosPageOut:
    rows, more = paged(svc.list_classes(db=db), lambda q: (-q.priority, q.name), limit, cursor)
    return QosPageOut(items=[QosOut.model_validate(q) for q in rows], next_cursor=more)


@router.get("/{name}", response_model=QosOut, summary="One QoS class")
def get_qos_class(name: QosPath, db: SessionDep, who: CurrentPrincipal) -> QosOut:
    return QosOut.model_validate(svc.get_class(db=db, name=name))


@router.patch("/{name}", response_model=QosOut, summary="Edit a QoS class (admin)")
def update_qos_class(name: QosPath, body: QosUpdate, db: SessionDep, who: CurrentPrincipal) -> QosOut:
    changes = {k: v for k, v in body.model_dump(exclude_unset=True).items() if v is not None or k not in NOT_NULL}
    return QosOut.model_validate(svc.update_class(db=db, principal=who, name=name, changes=changes))
