"""Peak GPU memory of a training job, predicted from its spec before it runs (torch-free).

Each term is counted for what it is, per rank, for AdamW with fp32 master weights:

    weights 4P + AdamW moments 8P + gradients 4P (counted at the peak: see below)
    + compute-dtype copies of the matmul weights that autocast keeps for backward (2P under bf16/fp16)
    + activations saved for backward and the loss's transient (the recipe's own count)

Under FSDP2 the persistent terms are divided by the world size, plus the largest unsharded block (twice:
the current one and the prefetched next).  Gradients and activations are not alive together at full size:
activations are freed as gradients appear, so the peak holds the larger of the two plus the other's
unavoidable part; we count activations + the first gradients produced (the tied LM head/embedding) as the
recipe reports through ``activation_bytes``, and gradients fully only when they exceed activations.

Compared like for like with ``torch.cuda.max_memory_allocated``: live tensor bytes only, so the CUDA context
(~0.5 GB), cuBLAS workspaces and the caching allocator's reserved-but-free blocks are outside both figures.
The API calls ``predict_for_spec`` at submit; the trainer calls ``predict`` with what it resolved on the device.
"""

from __future__ import annotations

from typing import Any

from core.recipes import TrainingHyperparameters
from core.spec import JobSpec


def predict(
    *,
    param_count: int,
    activation_bytes: int,
    precision: str,
    strategy: str,
    world_size: int,
    largest_block_params: int,
    grad_accum: int = 1,
    check_bytes: int = 0,
) -> dict[str, Any]:
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
        "breakdown": {
            "weights": weights,
            "optimizer": optimizer,
            "gradients": grads,
            "autocast_copies": casts,
            "fsdp_unsharded": unsharded,
            "activations": activation_bytes,
            "eager_check": check_bytes,
            "at": "training" if train >= check else "eager_check",
        },
        "strategy": strategy,
        "precision": precision,
    }


def predict_for_spec(spec: JobSpec, hp: TrainingHyperparameters) -> int | None:
    """Per-GPU peak of a GPU job as the trainer will run it on a GPU that supports bf16 (``auto`` precision is
    bf16 there; ``auto`` compile compiles; ``auto`` parallelism replicates while a replica fits, so DDP is the
    figure that decides whether it fits at all). None for CPU jobs."""
    if spec.resources.gpus == 0:
        return None
    shape = hp.shape()
    precision = "bf16" if spec.precision == "auto" else spec.precision
    compiled = spec.compile.mode != "off"
    strategy = "fsdp" if spec.parallelism == "fsdp" else "ddp"
    predicted = predict(
        param_count=shape.param_count(),
        activation_bytes=shape.activation_bytes(precision, compiled),
        precision=precision,
        strategy=strategy,
        world_size=spec.resources.gpus,
        largest_block_params=shape.largest_block_params(),
        grad_accum=hp.grad_accum,
        check_bytes=shape.eager_check_bytes(precision) if compiled else 0,
    )
    return int(predicted["predicted_peak_bytes"])
