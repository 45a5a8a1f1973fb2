"""Mixed precision: bf16 autocast where the hardware supports it, fp16 with a GradScaler, or plain fp32.

Master weights, gradients and optimizer state stay fp32 in every mode; only the forward/backward math is
cast.  fp16 uses torch's default GradScaler schedule and reports the share of steps skipped for overflow.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Literal

import torch

Precision = Literal["bf16", "fp16", "fp32"]

# The GradScaler's schedule for fp16: init 65536, growth 2, backoff 0.5, interval 2000 (torch's defaults).
SCALER_INIT = 65536.0
SCALER_GROWTH = 2.0
SCALER_BACKOFF = 0.5
SCALER_INTERVAL = 2000


def resolve(requested: str, device: torch.device) -> Precision:
    """``auto`` -> bf16 on a GPU that supports it, fp32 elsewhere (CPU bf16 autocast is slower than fp32)."""
    if requested == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp32"
    if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    if requested in ("bf16", "fp16", "fp32"):
        return requested  # type: ignore[return-value]
    raise ValueError(f"unknown precision {requested!r}")


@dataclasses.dataclass
class PrecisionContext:
    precision: Precision
    device: torch.device
    scaler: torch.amp.GradScaler | None = None
    steps: int = 0
    overflows: int = 0

    @classmethod
    def create(cls, precision: Precision, device: torch.device, *, tf32: bool = False) -> PrecisionContext:
        # fp32 matmuls on TF32 tensor cores: the fallback where bf16 GEMMs are wrong (trainer/gemm_check.py)
        if tf32:  # process-wide in torch; this process trains one model
            torch.backends.cuda.matmul.allow_tf32 = True
        scaler = None
        if precision == "fp16":
            scaler = torch.amp.GradScaler(
                device.type,
                init_scale=SCALER_INIT,
                growth_factor=SCALER_GROWTH,
                backoff_factor=SCALER_BACKOFF,
                growth_interval=SCALER_INTERVAL,
            )
        return cls(precision=precision, device=device, scaler=scaler)

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.precision]

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the update (the scaler skips it on overflow) and count overflows for the report."""
        if self.scaler is None:
            optimizer.step()
            return
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        self.steps += 1
        if self.scaler.get_scale() < before:  # backoff happened: this step overflowed and was skipped
            self.overflows += 1

    @property
    def overflow_rate(self) -> float | None:
        return self.overflows / self.steps if self.scaler is not None and self.steps else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "steps": self.steps,
            "overflows": self.overflows,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.steps = int(state.get("steps", 0))
        self.overflows = int(state.get("overflows", 0))
