"""The built-in ``mlp`` recipe's hyperparameters and shape: a residual MLP classifying a Gaussian mixture."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import Field

from core.recipes.training import Finite, TrainingHyperparameters


@dataclasses.dataclass(frozen=True)
class MLPShape:
    in_dim: int
    width: int
    depth: int
    classes: int
    batch_size: int

    def block_params(self) -> int:
        w = self.width
        return 2 * w + 4 * w * w + 4 * w + 4 * w * w + w  # LayerNorm, fc1, fc2 (weights and biases)

    def param_count(self) -> int:
        w = self.width
        return (self.in_dim * w + w) + self.depth * self.block_params() + (w * self.classes + self.classes)

    def largest_block_params(self) -> int:
        return self.block_params()

    def items_per_batch(self) -> int:
        return self.batch_size

    def flops_per_item(self) -> float:
        return 6.0 * self.param_count()

    def activation_bytes(self, precision: str, compiled: bool) -> int:
        e = 4 if precision == "fp32" else 2
        per_sample = (
            self.in_dim * 4
            + self.depth * (4 * self.width + e * (self.width + 8 * self.width))
            + (self.classes * (e + 8))
        )
        return self.batch_size * per_sample

    def eager_check_bytes(self, precision: str) -> int:
        return 0


class MLPHyperparameters(TrainingHyperparameters):
    in_dim: Annotated[int, Field(ge=1, le=1 << 16)] = 32
    width: Annotated[int, Field(ge=1, le=1 << 16)] = 128
    depth: Annotated[int, Field(ge=1, le=256)] = 2
    classes: Annotated[int, Field(ge=2, le=1 << 16)] = 10
    batch_size: Annotated[int, Field(ge=1, le=1 << 20)] = 64
    noise: Annotated[float, Finite, Field(ge=0.0, le=1e6, description="Spread of each class around its mean.")] = 1.0

    def shape(self) -> MLPShape:
        return MLPShape(self.in_dim, self.width, self.depth, self.classes, self.batch_size)
