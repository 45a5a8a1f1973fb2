"""One training step, apart from the loop: forward and backward over the micro-batches, clipping, the optimizer's
update (a non-finite one skipped on the device), and the loss and grad norm queued for reading behind the step."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from trainer.checkpoint import Checkpointer
from trainer.config import TrainerConfig
from trainer.parallel import DistEnv
from trainer.precision import PrecisionContext
from trainer.recipes import Recipe


class Pending(NamedTuple):
    """A step queued on the device, not read yet: its loss and grad norm (pinned host memory on CUDA, filled behind
    the step) and the event recorded after it (None on CPU)."""

    step: int
    batch: int  # the data position, for the spike guard
    values: torch.Tensor
    event: torch.cuda.Event | None


@dataclasses.dataclass(frozen=True)
class StepParts:
    """What every step works with, fixed once training starts (a rollback restores into these same objects)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    fused: bool  # the optimizer skips a non-finite update on the device (found_inf)
    recipe: Recipe
    data: Any
    prec: PrecisionContext
    cfg: TrainerConfig
    env: DistEnv
    ckpt: Checkpointer
    params: list[torch.Tensor]  # those clipped
    poisoned: set[int]  # data positions the loss_spike test hook poisons


def _scalar(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)  # FSDP2 returns the grad norm as a (replicated) DTensor
    return full() if callable(full) else t


def _no_sync(model: nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager[Any]:
    if not skip_sync:
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    if callable(no_sync):
        return no_sync()
    return contextlib.nullcontext()


def train_step(parts: StepParts, lr: float) -> tuple[int, torch.Tensor, torch.Tensor]:
    """One optimizer step at learning rate ``lr``: (the last micro-batch's data position, the mean loss over the
    ranks, the grad norm), both tensors still on the device (nothing here waits for the GPU)."""
    cfg, device = parts.cfg, parts.env.device
    loss_sum = torch.zeros((), device=device)
    index = -1
    for micro in range(cfg.grad_accum):
        index, batch = parts.data.next()
        if index in parts.poisoned:
            batch = parts.recipe.poison(batch)
        batch = parts.recipe.batch_to(batch, device)
        with _no_sync(parts.model, micro < cfg.grad_accum - 1), parts.prec.autocast():
            loss = parts.recipe.loss(parts.model, batch) / cfg.grad_accum
        if index in cfg.hooks.nonfinite_at_step:
            loss = loss * float("nan")
        parts.prec.scale(loss).backward()
        loss_sum += loss.detach()
    for g in parts.optimizer.param_groups:
        g["lr"] = lr
    parts.prec.unscale(parts.optimizer)
    gn = _scalar(
        torch.nn.utils.clip_grad_norm_(parts.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"), foreach=True)
    )
    parts.ckpt.before_optimizer_step()
    _update(parts, gn)
    if parts.env.distributed:
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss_sum /= parts.env.world_size
    return index, loss_sum, gn


def _update(parts: StepParts, gn: torch.Tensor) -> None:
    """The optimizer's update, unless the grad norm is non-finite: skipped on the device by fused AdamW (no wait),
    by the host otherwise, by the grad scaler under fp16."""
    optimizer = parts.optimizer
    if parts.prec.scaler is None:
        if parts.fused:
            optimizer.found_inf = (~torch.isfinite(gn)).float()  # type: ignore[attr-defined]
            optimizer.step()
            optimizer.found_inf = None  # type: ignore[attr-defined]
        elif bool(torch.isfinite(gn)):
            optimizer.step()
    else:
        parts.prec.step(optimizer)
    optimizer.zero_grad(set_to_none=True)


def queue_readback(
    step: int, index: int, loss_sum: torch.Tensor, gn: torch.Tensor, ring: torch.Tensor | None
) -> Pending:
    """The step's loss and grad norm, copied behind it into its slot of the pinned ``ring`` with an event recorded
    after them (on CUDA); on CPU (no ring) the values themselves."""
    values = torch.stack((loss_sum.detach().float(), gn.detach().float()))
    event: torch.cuda.Event | None = None
    if ring is not None:
        values = ring[step % len(ring)].copy_(values, non_blocking=True)
        event = torch.cuda.Event(enable_timing=True)
        event.record()
    return Pending(step, index, values, event)
