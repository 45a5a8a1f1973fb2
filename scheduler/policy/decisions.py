"""What ``plan()`` decides: admissions with placements, preemptions, pending reasons, failures, time-limit kills."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from core.states import Reason
from scheduler.policy.snapshot import GpuShare


@dataclass(frozen=True, slots=True)
class PlacementEntry:
    host: str
    queue: str
    gpus: tuple[str, ...]  # GPU uuids in local-rank order
    slots: int  # processes on this host
    node_rank: int
    share: GpuShare | None = None  # a fractional job's part of its one GPU

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "host": self.host,
            "queue": self.queue,
            "gpus": list(self.gpus),
            "slots": self.slots,
            "node_rank": self.node_rank,
        }
        if self.share is not None:
            out["share"] = {
                "memory_bytes": self.share.memory_bytes,
                "sm_percent": self.share.sm_percent,
                "guaranteed": self.share.guaranteed,
            }
        return out


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: int
    placement: tuple[PlacementEntry, ...]
    backfilled: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: int
    reason: str
    preemptor_id: int | None = None


class Pending(NamedTuple):
    """A plain tuple, not a dataclass: a cycle builds one per pending job (ten thousand), at a third of the cost."""

    job_id: int
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Failure:
    job_id: int
    message: str


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: int
    start: float | None  # expected start (None: unknown, running jobs have no end estimate)
    gpus: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Decisions:
    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    pending: tuple[Pending, ...] = ()
    failures: tuple[Failure, ...] = ()
    time_limit_kills: tuple[Failure, ...] = ()
    reservations: tuple[Reservation, ...] = field(default=())
