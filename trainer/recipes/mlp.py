"""A small non-transformer recipe: a residual MLP classifying points drawn from a fixed Gaussian mixture.

The mixture's class means are a function of the seed, and batch ``i`` is a function of (seed, i), so the
task is learnable, deterministic and resumable exactly like the GPT's corpus.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.recipes.mlp import MLPHyperparameters
from trainer.data import IndexedBatches
from trainer.recipes import ShapedRecipe


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
    def __init__(
        self, *, in_dim: int, classes: int, batch_size: int, rank: int, world_size: int, seed: int, noise: float
    ) -> None:
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
        return x[lo : lo + self.batch_size], y[lo : lo + self.batch_size]


class MLPRecipe(ShapedRecipe):
    name = "mlp"

    def __init__(self, hyperparameters: dict[str, Any]) -> None:
        super().__init__(hyperparameters)
        params = self.params
        assert isinstance(params, MLPHyperparameters)
        self.shape = params.shape()
        self.in_dim, self.width, self.depth = params.in_dim, params.width, params.depth
        self.classes, self.batch_size, self.noise = params.classes, params.batch_size, params.noise

    def build_model(self) -> nn.Module:
        return MLP(self.in_dim, self.width, self.depth, self.classes)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        assert isinstance(model, MLP)
        return list(model.blocks)

    def make_data(self, *, rank: int, world_size: int, seed: int) -> MixtureBatches:
        return MixtureBatches(
            in_dim=self.in_dim,
            classes=self.classes,
            batch_size=self.batch_size,
            rank=rank,
            world_size=world_size,
            seed=seed,
            noise=self.noise,
        )

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x).float(), y)

    def poison(self, batch: Any) -> Any:
        x, y = batch
        return x * 100.0, (y + 1) % self.classes
