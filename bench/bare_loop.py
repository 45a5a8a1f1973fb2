"""The hand-written training loop that the benches hold kiln's trainer against (``--bare`` mode of
``trainer_bench.py`` and ``usercode_bench.py``): bf16 autocast on GPU, AdamW with decay on the matrices only, clip,
and the clock around the steps after the warm-up. Imported inside a bare child process, so torch is imported here."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch


def adamw(model: torch.nn.Module, *, fused: bool) -> torch.optim.AdamW:
    """AdamW as GPT-2 recipes set it: weight decay 0.1 on the matrices, none on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4,
        betas=(0.9, 0.95),
        fused=fused,
    )


def gpt_batches(recipe: Any, device: torch.device) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The job's own data for a bare loop of the ``gpt`` recipe, drawn on the device: a real corpus (its token
    frequencies set the embedding backward's atomics) lies there whole and each batch is random windows gathered
    there; a synthetic job gets uniform tokens."""
    b, t, v = recipe.batch_size, recipe.cfg.seq_len, recipe.cfg.vocab_size
    tokens = recipe.make_data(rank=0, world_size=1, seed=0).tokens
    corpus = tokens.to(device) if tokens is not None else None
    window = torch.arange(t + 1, device=device)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        if corpus is None:
            return torch.randint(0, v, (b, t), device=device), torch.randint(0, v, (b, t), device=device)
        starts = torch.randint(0, corpus.numel() - t - 1, (b, 1), device=device)
        seqs = corpus[starts + window].long()
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    return draw


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, loss: Callable[[], torch.Tensor], device: torch.device
) -> Callable[[], torch.Tensor]:
    """One step: ``loss()`` (its batch and forward pass) under bf16 autocast on GPU, backward, clip at 1.0, the
    optimizer's step; returns the loss, detached."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            value = loss()
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return value.detach()

    return step


def timed_steps(
    step: Callable[[], torch.Tensor], *, warmup: int, steps: int, items_per_step: int, device: torch.device
) -> None:
    """Run ``warmup`` steps, then ``steps`` more on the clock (until the device has the last loss), and print the
    JSON line the parent process reads: items per second over the timed steps, their count, the last loss."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        last = step()
    last.item()
    dt = time.perf_counter() - t0
    print(
        json.dumps({"tokens_per_s": items_per_step * steps / dt, "measured_steps": steps, "loss": float(last.item())})
    )
