"""A team's own model on its own data: a small CNN trained on a registered dataset of .npz shards (the digits
written by ``make_dataset.py``). kiln passes the dataset's directory by name (``datasets["digits-npz"]``, mounted
read-only for the attempt); the module never names a host path.

It follows kiln's recipe protocol, version 1 (docs/user-code.md, "Datasets").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

KILN_PROTOCOL = 1
DATASET = "digits-npz"  # the name the spec's ``datasets:`` gives


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channels: int = Field(default=16, ge=1, le=256)
    hidden: int = Field(default=64, ge=1, le=4096)
    batch_size: int = Field(default=64, ge=1, le=1024)


class DigitsCNN(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc1 = nn.Linear(2 * channels * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


@lru_cache(maxsize=2)
def _load(directory: Path, pattern: str) -> tuple[torch.Tensor, torch.Tensor]:
    shards = sorted(directory.glob(pattern))
    if not shards:
        raise FileNotFoundError(f"no {pattern} in the dataset {DATASET!r} ({directory})")
    arrays = [np.load(path) for path in shards]
    x = torch.from_numpy(np.concatenate([a["x"] for a in arrays])).unsqueeze(1)
    y = torch.from_numpy(np.concatenate([a["y"] for a in arrays]))
    return x, y


def build_model(hp: Hyperparameters) -> nn.Module:
    return DigitsCNN(hp.channels, hp.hidden)


def batches(
    hp: Hyperparameters, *, rank: int, world_size: int, seed: int, start: int, datasets: Mapping[str, Path]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batch i is drawn with a generator seeded by (seed, i): resuming at ``start`` replays the same batches."""
    x, y = _load(datasets[DATASET], "train-*.npz")
    i = start
    while True:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        pick = torch.randint(0, len(y), (world_size * hp.batch_size,), generator=gen)
        mine = pick[rank * hp.batch_size : (rank + 1) * hp.batch_size]
        yield x[mine], y[mine]
        i += 1


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x).float(), y)


def evaluate(
    model: nn.Module, hp: Hyperparameters, *, rank: int, world_size: int, datasets: Mapping[str, Path]
) -> dict[str, float]:
    x, y = _load(datasets[DATASET], "heldout.npz")
    device = next(model.parameters()).device
    logits = model(x.to(device)).float().cpu()
    accuracy = float((logits.argmax(1) == y).float().mean())
    return {"accuracy": accuracy, "heldout_loss": float(F.cross_entropy(logits, y))}


def items_per_batch(hp: Hyperparameters) -> int:
    return hp.batch_size
