"""A small non-transformer recipe: a residual MLP classifying points drawn from a fixed Gaussian mixture.

The mixture's class means are a function of the seed, and batch ``i`` is a function of (seed, i), so the
task is learnable, deterministic and resumable exactly like the GPT's corpus.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import hp_get
from trainer.data import IndexedBatches
from trainer.precision import Precision
from trainer.recipes import Recipe


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, in_dim: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(depth))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class MixtureBatches(IndexedBatches):
    def __init__(self, *, in_dim: int, classes: int, batch_size: int, rank: int, world_size: int,
                 seed: int, noise: float) -> None:
        super().__init__(batch_size=batch_size, rank=rank, world_size=world_size, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        self.means = torch.randn(classes, in_dim, generator=gen) * 2.0
        self.noise = noise

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.generator(index)
        n = self.world_size * self.batch_size
        y = torch.randint(0, self.means.shape[0], (n,), generator=gen)
        x = self.means[y] + self.noise * torch.randn(n, self.means.shape[1], generator=gen)
        lo = self.rank * self.batch_size
        return x[lo:lo + self.batch_size], y[lo:lo + self.batch_size]


class MLPRecipe(Recipe):
    name = "mlp"

    def __init__(self, hyperparameters: dict[str, Any]) -> None:
        super().__init__(hyperparameters)
        hp = self.hp
        self.in_dim = hp_get(hp, "in_dim", 32, int, lo=1, hi=1 << 16)
        self.width = hp_get(hp, "width", 128, int, lo=1, hi=1 << 16)
        self.depth = hp_get(hp, "depth", 2, int, lo=1, hi=256)
        self.classes = hp_get(hp, "classes", 10, int, lo=2, hi=1 << 16)
        self.batch_size = hp_get(hp, "batch_size", 64, int, lo=1, hi=1 << 20)
        self.noise = hp_get(hp, "noise", 1.0, float, lo=0.0)

    def build_model(self) -> nn.Module:
        return MLP(self.in_dim, self.width, self.depth, self.classes)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        assert isinstance(model, MLP)
        return list(model.blocks)

    def make_data(self, *, rank: int, world_size: int, seed: int) -> MixtureBatches:
        return MixtureBatches(in_dim=self.in_dim, classes=self.classes, batch_size=self.batch_size, rank=rank,
                              world_size=world_size, seed=seed, noise=self.noise)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x).float(), y)

    def poison(self, batch: Any) -> Any:
        x, y = batch
        return x * 100.0, (y + 1) % self.classes

    def items_per_batch(self) -> int:
        return self.batch_size

    def param_count(self) -> int:
        w = self.width
        return (self.in_dim * w + w) + self.depth * (2 * w + 4 * w * w + 4 * w + 4 * w * w + w) + (
            w * self.classes + self.classes)

    def flops_per_item(self) -> float:
        return 6.0 * self.param_count()

    def activation_bytes(self, precision: Precision, compiled: bool) -> int:
        e = 4 if precision == "fp32" else 2
        per_sample = self.in_dim * 4 + self.depth * (4 * self.width + e * (self.width + 8 * self.width)) + (
            self.classes * (e + 8))
        return self.batch_size * per_sample
