"""The QoS memory cap on the device, and the peak memory measured during the run (``core.memory`` predicts it)."""

from __future__ import annotations

import os

import torch

from core.trainer_protocol import ENV_MEMORY_FRACTION


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
    return {
        "mem_allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "mem_peak_bytes": int(torch.cuda.max_memory_allocated(device)),
    }
