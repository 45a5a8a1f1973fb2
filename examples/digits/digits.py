"""A team's own model, written outside kiln: a small CNN on scikit-learn's handwritten digits (8x8 images, shipped
inside scikit-learn's wheel: nothing is downloaded), with held-out accuracy as its evaluation.

It follows kiln's recipe protocol, version 1 (docs/user-code.md): kiln builds the optimiser, compiles, checkpoints,
resumes and reports; this module says what the model, the data, the loss and the evaluation are.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

KILN_PROTOCOL = 1
HELD_OUT = 0.2  # of the 1797 images, kept out of training for the evaluation (a fixed split)


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channels: int = Field(default=16, ge=1, le=256)
    hidden: int = Field(default=64, ge=1, le=4096)
    batch_size: int = Field(default=64, ge=1, le=1437)


class DigitsCNN(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc1 = nn.Linear(2 * channels * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 8x8 -> 4x4
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


@lru_cache(maxsize=1)
def _split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixel values are 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))  # the same split for every job
    cut = int(len(y) * (1 - HELD_OUT))
    train, test = order[:cut], order[cut:]
    return x[train], y[train], x[test], y[test]


def build_model(hp: Hyperparameters) -> nn.Module:
    return DigitsCNN(hp.channels, hp.hidden)


def batches(
    hp: Hyperparameters, *, rank: int, world_size: int, seed: int, start: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batch i is drawn with a generator seeded by (seed, i): resuming at ``start`` replays the same batches."""
    x, y, _, _ = _split()
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


def evaluate(model: nn.Module, hp: Hyperparameters, *, rank: int, world_size: int) -> dict[str, float]:
    """Accuracy and loss on the held-out images (every rank scores all of them: there are only 360)."""
    _, _, x, y = _split()
    device = next(model.parameters()).device
    logits = model(x.to(device)).float()
    return {
        "accuracy": float((logits.argmax(1).cpu() == y).float().mean()),
        "heldout_loss": float(F.cross_entropy(logits.cpu(), y)),
    }


def items_per_batch(hp: Hyperparameters) -> int:
    return hp.batch_size
