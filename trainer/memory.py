"""Peak GPU memory: predicted from the spec before the run, measured during it, and the QoS cap.

The seed's formula (``params + activations + 2 * (params + activations)``) treats gradients and optimizer
state as proportional to activations, which they are not.  Here each term is counted for what it is, per
rank, for AdamW with fp32 master weights:

    weights 4P + AdamW moments 8P + gradients 4P (counted at the peak: see below)
    + compute-dtype copies of the matmul weights that autocast keeps for backward (2P under bf16/fp16)
    + activations saved for backward and the loss's transient (the recipe's own count)

Under FSDP2 the persistent terms are divided by the world size, plus the largest unsharded block (twice:
the current one and the prefetched next).  Gradients and activations are not alive together at full size:
activations are freed as gradients appear, so the peak holds the larger of the two plus the other's
unavoidable part; we count activations + the first gradients produced (the tied LM head/embedding) as the
recipe reports through ``activation_bytes``, and gradients fully only when they exceed activations.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from core.trainer_protocol import ENV_MEMORY_FRACTION
from trainer.precision import Precision

# Compared like for like with torch.cuda.max_memory_allocated: that counts live tensor bytes only, so the
# CUDA context (~0.5 GB), cuBLAS workspaces, the caching allocator's reserved-but-free blocks
# (fragmentation) and Triton's own allocations are outside both figures.
CUDA_CONTEXT_RESERVE = 0


def predict(*, param_count: int, activation_bytes: int, precision: Precision, strategy: str, world_size: int,
            largest_block_params: int, grad_accum: int = 1, check_bytes: int = 0) -> dict[str, Any]:
    """``check_bytes``: the compile breaker's eager no-grad reference forward, which runs before the optimizer
    state exists; the peak is the larger of that moment and the training peak."""
    p = param_count
    shard = world_size if strategy == "fsdp" else 1
    weights = 4 * p // shard
    optimizer = 8 * p // shard
    grads = 4 * p // shard
    casts = (2 * p if precision != "fp32" else 0) // shard
    unsharded = 2 * 4 * largest_block_params if strategy == "fsdp" and world_size > 1 else 0
    # With accumulation the gradients of earlier micro-batches are alive beside the activations.
    at_peak = activation_bytes + (grads if grad_accum > 1 else 0)
    train = weights + optimizer + casts + unsharded + max(at_peak, grads)
    check = weights + unsharded + check_bytes
    peak = max(train, check)
    return {
        "predicted_peak_bytes": int(peak),
        "breakdown": {"weights": weights, "optimizer": optimizer, "gradients": grads, "autocast_copies": casts,
                      "fsdp_unsharded": unsharded, "activations": activation_bytes,
                      "eager_check": check_bytes, "at": "training" if train >= check else "eager_check"},
        "strategy": strategy,
        "precision": precision,
    }


def apply_memory_cap(device: torch.device) -> float | None:
    """Enforce the QoS memory cap (KILN_GPU_MEMORY_FRACTION): allocations beyond it raise OOM."""
    raw = os.environ.get(ENV_MEMORY_FRACTION)
    if not raw or device.type != "cuda":
        return None
    fraction = float(raw)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{ENV_MEMORY_FRACTION} must be in (0, 1], got {raw}")
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def measured(device: torch.device) -> dict[str, int | None]:
    if device.type != "cuda":
        return {"mem_allocated_bytes": None, "mem_peak_bytes": None}
    return {"mem_allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "mem_peak_bytes": int(torch.cuda.max_memory_allocated(device))}
