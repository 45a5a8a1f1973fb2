"""Process groups and data parallelism: DDP or FSDP2 (``fully_shard``), chosen per spec or automatically.

torchrun provides RANK / LOCAL_RANK / WORLD_SIZE and the rendezvous (one host or many).  The training
group is NCCL on GPUs and gloo on CPU.  Two extra gloo groups carry host-side traffic that must not queue
behind GPU work or interleave with it: ``ctrl`` (per-step agreement: stop, checkpoint due) and ``ckpt``
(checkpoint collectives, which run in the writer thread).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.precision import PrecisionContext


@dataclasses.dataclass
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None
    ctrl: Any = None
    ckpt: Any = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(timeout_s: float = 600.0) -> DistEnv:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world == 1:
        return DistEnv(rank, local_rank, 1, device, None)
    # NCCL reports collective failures asynchronously; make them abort the process instead of hanging.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    ctrl = dist.new_group(backend="gloo")
    ckpt = dist.new_group(backend="gloo")
    return DistEnv(rank, local_rank, world, device, backend, ctrl, ckpt)


def shutdown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


def device_capacity(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def choose_strategy(
    requested: str, *, predicted_ddp_bytes: int, capacity: int | None, world_size: int, headroom: float = 0.85
) -> str:
    """``auto``: replicate (DDP) while a full replica fits in ``headroom`` of the GPU, else shard (FSDP2).
    On CPU there is no device limit to fit, so DDP."""
    if requested in ("ddp", "fsdp"):
        return requested
    if world_size > 1 and capacity is not None and predicted_ddp_bytes > headroom * capacity:
        return "fsdp"
    return "ddp"


def wrap(
    model: nn.Module, blocks: list[nn.Module], *, strategy: str, env: DistEnv, precision: PrecisionContext
) -> nn.Module:
    """Apply data parallelism.  One process needs none: the bare module trains alone (no DDP overhead)."""
    if not env.distributed:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # Autocast does the compute casts; FSDP's policy keeps the all-gathered params and the gradient
        # reduction in fp32 so sharded and replicated runs are numerically the same recipe.
        mp = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
        for block in blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(
        model,
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        static_graph=False,
    )
