"""QoS classes."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentPrincipal, SessionDep
from api.routers.common import ERRORS, QosPath
from api.schemas.qos import QosOut, QosUpdate
from core.services import qos as svc

router = APIRouter(prefix="/v1/qos", tags=["qos"], responses=ERRORS)

NOT_NULL = ("priority", "preemptible", "sm_percent", "description")


@router.get("", response_model=list[QosOut], summary="QoS classes, highest priority first")
def list_qos_classes(db: SessionDep, who: CurrentPrincipal) -> list[QosOut]:
    return [QosOut.model_validate(q) for q in svc.list_classes(db=db)]


@router.get("/{name}", response_model=QosOut, summary="One QoS class")
def get_qos_class(name: QosPath, db: SessionDep, who: CurrentPrincipal) -> QosOut:
    return QosOut.model_validate(svc.get_class(db=db, name=name))


@router.patch("/{name}", response_model=QosOut, summary="Edit a QoS class (admin)")
def update_qos_class(name: QosPath, body: QosUpdate, db: SessionDep, who: CurrentPrincipal) -> QosOut:
    changes = {k: v for k, v in body.model_dump(exclude_unset=True).items() if v is not None or k not in NOT_NULL}
    return QosOut.model_validate(svc.update_class(db=db, principal=who, name=name, changes=changes))
