"""Fractional GPUs: the shared GPUs of a cycle, and which one a fractional job may join.

The rules (docs/scheduler.md, "GPU sharing"):

* fractional and whole-GPU jobs never mix on a GPU: a GPU that holds a fractional job is out of the free pool,
  and it returns to it only when its last fractional job ends;
* one team per shared GPU: MPS serves one Linux user per GPU at a time (clients of a second user wait until the
  first user's are gone), and each team's attempts run as that team's own user, so only a team's own jobs share;
* at most ``MPS_MAX_CLIENTS_PER_GPU`` fractional jobs on one GPU;
* the memory shares on a GPU never add up past its memory (MPS pins each client's limit);
* the guaranteed SM shares (non-preemptible classes) never add up past 100%; best-effort shares may, because
  MPS caps each client and a best-effort client only fills what the guaranteed ones leave idle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.gpu_types import MPS_MAX_CLIENTS_PER_GPU
from scheduler.policy.snapshot import GpuShare


@dataclass(slots=True)
class SharedGpu:
    host: str
    uuid: str
    model: str
    team_id: int
    memory_bytes: int  # the GPU's
    memory_used: int = 0
    sm_guaranteed: int = 0  # percent
    jobs: int = 0

    def room_for(self, team_id: int, share: GpuShare) -> bool:
        return (
            team_id == self.team_id
            and self.jobs < MPS_MAX_CLIENTS_PER_GPU
            and self.memory_used + share.memory_bytes <= self.memory_bytes
            and (not share.guaranteed or self.sm_guaranteed + share.sm_percent <= 100)
        )

    def add(self, share: GpuShare) -> None:
        self.memory_used += share.memory_bytes
        if share.guaranteed:
            self.sm_guaranteed += share.sm_percent
        self.jobs += 1


def best_shared(
    gpus: Iterable[SharedGpu], team_id: int, models: tuple[str, ...], share: GpuShare, avoid: frozenset[str]
) -> SharedGpu | None:
    """Best fit among the GPUs this team already shares: the least memory left after the job, so whole GPUs stay
    whole for the jobs that need them. Hosts to avoid (the last attempt was lost there) come last."""
    fitting = [g for g in gpus if g.model in models and g.room_for(team_id, share)]
    if not fitting:
        return None
    return min(
        fitting, key=lambda g: (g.host in avoid, g.memory_bytes - g.memory_used - share.memory_bytes, g.host, g.uuid)
    )


def describe(share: GpuShare) -> str:
    kind = "guaranteed" if share.guaranteed else "best-effort"
    return f"{share.memory_bytes / 2**30:.1f} GiB and {share.sm_percent}% of the SMs ({kind})"
