"""What a worker holds of an attempt it claimed (``workers.claim``): read in the claim's transaction, so that
nothing after it needs the database to launch the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.models import GPU, QosClass
from workers.supervisor import Rendezvous


@dataclass
class Claimed:
    job_id: int
    team_id: int
    attempt_number: int
    spec: dict[str, Any]
    placement: list[dict[str, Any]]
    gpus: list[GPU]
    qos: QosClass | None
    host_links: dict[str, Any]
    rendezvous: Rendezvous | None
    ran_before_s: float  # the job's earlier attempts' run time, which its time limit counts too
    deployment: str  # the database's uid (core.deployment): a job's number is unique in one database only
    team: str = ""
    address: str | None = None  # where the other nodes of a gang reach this host (its worker's --address)
    datasets: dict[str, str] = field(default_factory=dict)  # name -> registered path, of those still registered

    def slots(self, node_rank: int) -> int:
        """The training processes of one node: one per GPU, or its CPU slots."""
        node = self.placement[node_rank]
        return len(node.get("gpus") or []) or int(node.get("slots") or 1)
