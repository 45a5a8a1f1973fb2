"""A team's own GPT, written outside kiln (not kiln's built-in ``gpt`` recipe): pre-norm blocks with a fused QKV
projection, SDPA attention, tied embeddings, the loss computed in ``forward`` so a whole-model compile captures it.
Trained on synthetic tokens (no download): batch i drawn from a generator seeded by (seed, i).

Recipe protocol 1 (docs/user-code.md). ``bench/usercode_bench.py`` runs it through kiln's trainer and in a
hand-written compiled loop, in one run, and reports the ratio.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

KILN_PROTOCOL = 1


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: int = Field(default=12, ge=1)
    width: int = Field(default=768, ge=8)
    heads: int = Field(default=12, ge=1)
    vocab: int = Field(default=50304, ge=2)
    context: int = Field(default=1024, ge=2)
    batch_size: int = Field(default=32, ge=1)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class TinyGPT(nn.Module):
    def __init__(self, hp: Hyperparameters) -> None:
        super().__init__()
        self.embed = nn.Embedding(hp.vocab, hp.width)
        self.position = nn.Parameter(torch.zeros(hp.context, hp.width))
        self.blocks = nn.ModuleList(Block(hp.width, hp.heads) for _ in range(hp.layers))
        self.norm = nn.LayerNorm(hp.width)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * hp.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.position[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.norm(x), self.embed.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def build_model(hp: Hyperparameters) -> nn.Module:
    return TinyGPT(hp)


def blocks(model: TinyGPT) -> list[nn.Module]:
    return list(model.blocks)


def batches(
    hp: Hyperparameters, *, rank: int, world_size: int, seed: int, start: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    i = start
    while True:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        full = torch.randint(0, hp.vocab, (world_size * hp.batch_size, hp.context + 1), generator=gen)
        mine = full[rank * hp.batch_size : (rank + 1) * hp.batch_size]
        yield mine[:, :-1].contiguous(), mine[:, 1:].contiguous()
        i += 1


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    out: torch.Tensor = model(x, y)
    return out


def items_per_batch(hp: Hyperparameters) -> int:
    return hp.batch_size * hp.context


def flops_per_item(hp: Hyperparameters) -> float:
    """PaLM appendix B: 6N (N without the position table) + attention 12 L W T per token."""
    per_block = 12 * hp.width * hp.width + 4 * hp.width
    n = hp.vocab * hp.width + hp.layers * per_block + 2 * hp.width
    return 6.0 * n + 12.0 * hp.layers * hp.width * hp.context
