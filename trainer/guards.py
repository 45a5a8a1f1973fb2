"""Loss-spike guard: a spiking loss is rolled back, not trained through (rolling statistics in the manner of llm.c's
outlier detector).

Each finished step reports its (globally averaged) loss and the global grad norm.  A step is *suspect* when
its loss exceeds ``factor`` x the moving average of the last ``window`` accepted steps, or when its grad
norm is both ``grad_z`` standard deviations above its mean and ``factor`` x that mean; never when its loss is
under ``min_loss`` (near zero, one hard batch is many times the mean and no sign of divergence).  ``confirm_steps``
consecutive suspect steps confirm a spike: the loop then rolls back to the newest checkpoint taken before the
first suspect step and skips the batches involved.  Suspect steps never enter the statistics.
Non-finite values are handled before this guard (the update is skipped) and never enter them either.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Any

from trainer.config import GuardConfig


@dataclasses.dataclass(frozen=True)
class Spike:
    first_step: int
    steps: tuple[int, ...]
    batches: tuple[int, ...]
    loss: float
    loss_mean: float
    grad_norm: float
    grad_mean: float


class _Rolling:
    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def push(self, v: float) -> None:
        self.values.append(v)

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    def std(self) -> float:
        n = len(self.values)
        if n < 2:
            return math.nan
        m = self.mean()
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (n - 1))


class SpikeGuard:
    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self.loss = _Rolling(cfg.window)
        self.grad = _Rolling(cfg.window)
        self.pending: list[tuple[int, int, float, float]] = []  # (step, batch, loss, grad) suspects in a row
        self.spikes = 0  # confirmed spikes this attempt (not restored by a rollback, by design)

    def suspect(self, loss: float, grad_norm: float) -> bool:
        if not self.loss.full:
            return False  # too little history to call anything an outlier (early loss falls fast)
        if loss < self.cfg.min_loss:
            return False
        if loss > self.cfg.factor * self.loss.mean():
            return True
        g_mean, g_std = self.grad.mean(), self.grad.std()
        return (
            math.isfinite(g_std)
            and g_std > 0
            and (grad_norm - g_mean) / g_std > self.cfg.grad_z
            and grad_norm > self.cfg.factor * g_mean
        )

    def observe(self, step: int, batch: int, loss: float, grad_norm: float) -> Spike | None:
        """Feed one finished step; returns the Spike once confirmed."""
        if not self.cfg.enabled:
            return None
        if self.suspect(loss, grad_norm):
            self.pending.append((step, batch, loss, grad_norm))
            if len(self.pending) >= self.cfg.confirm_steps:
                spike = Spike(
                    first_step=self.pending[0][0],
                    steps=tuple(p[0] for p in self.pending),
                    batches=tuple(p[1] for p in self.pending),
                    loss=max(p[2] for p in self.pending),
                    loss_mean=self.loss.mean(),
                    grad_norm=max(p[3] for p in self.pending),
                    grad_mean=self.grad.mean(),
                )
                self.pending.clear()
                self.spikes += 1
                return spike
            return None
        # A lone blip that did not repeat: its update stands, but it stays out of the statistics.
        self.pending.clear()
        self.loss.push(loss)
        self.grad.push(grad_norm)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"loss": list(self.loss.values), "grad": list(self.grad.values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss.values.clear()
        self.grad.values.clear()
        self.loss.values.extend(float(v) for v in state.get("loss", []))
        self.grad.values.extend(float(v) for v in state.get("grad", []))
        self.pending.clear()
