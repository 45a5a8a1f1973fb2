"""A decoder-only GPT (GPT-2 architecture): pre-LayerNorm blocks, ``scaled_dot_product_attention``,
tied input/output embeddings, vocabulary padded to a multiple of 64 so the LM head's matmul stays aligned.

Sizes run from ``tiny`` (CPU tests) to GPT-2 XL; ``gpt2`` is the 124M model (12 layers, 768 wide, 12 heads,
vocab 50304, context 1024).  Data is the byte-level stdlib corpus (vocab 256) or synthetic tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.recipes.gpt import GPTHyperparameters, GPTShape
from trainer.data import TokenBatches, build_stdlib_corpus
from trainer.recipes import ShapedRecipe


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTShape) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTShape) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class HeadLoss(nn.Module):
    """Final LayerNorm, tied LM head and cross-entropy as one module without parameters of its own (they are
    passed in, so the state dict is unchanged): regional compile gives it its own graph, so Inductor fuses
    the fp32 upcast, log-softmax and NLL instead of materialising [tokens, vocab] fp32 tensors."""

    def forward(
        self, x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, head_w: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        logits = F.linear(F.layer_norm(x, (x.size(-1),), ln_w, ln_b), head_w)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class GPT(nn.Module):
    def __init__(self, cfg: GPTShape) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.head_loss = HeadLoss()
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or with ``targets`` the mean cross-entropy: the loss is part of the forward so that a
        whole-model compile captures it in the same graph (as a hand-written compiled loop does)."""
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        if targets is not None:
            return self.head_loss(x, self.ln_f.weight, self.ln_f.bias, self.lm_head.weight, targets)
        return self.lm_head(self.ln_f(x))


def gpt_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y)


class GPTRecipe(ShapedRecipe):
    name = "gpt"

    def __init__(self, hyperparameters: dict[str, Any]) -> None:
        super().__init__(hyperparameters)
        params = self.params
        assert isinstance(params, GPTHyperparameters)
        self.cfg: GPTShape = params.shape()
        self.shape = self.cfg
        self.corpus = params.corpus
        self.batch_size = params.batch_size
        self.corpus_bytes = params.corpus_bytes

    def build_model(self) -> nn.Module:
        return GPT(self.cfg)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        assert isinstance(model, GPT)
        return list(model.h)

    def compile_regions(self, model: nn.Module) -> list[nn.Module]:
        assert isinstance(model, GPT)
        return [*model.h, model.head_loss]

    def make_data(self, *, rank: int, world_size: int, seed: int) -> TokenBatches:
        tokens = build_stdlib_corpus(self.corpus_bytes) if self.corpus == "stdlib" else None
        return TokenBatches(
            tokens=tokens,
            vocab_size=self.cfg.vocab_size,
            batch_size=self.batch_size,
            seq_len=self.cfg.seq_len,
            rank=rank,
            world_size=world_size,
            seed=seed,
        )

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return gpt_loss(model, x, y)

    def poison(self, batch: Any) -> Any:
        # Every target becomes byte/token 0, which never follows anything in the corpus: a trained model
        # puts almost no mass on it, so the loss jumps far above its moving average.
        x, y = batch
        return x, torch.zeros_like(y)
