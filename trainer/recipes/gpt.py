"""A decoder-only GPT (GPT-2 architecture): pre-LayerNorm blocks, ``scaled_dot_product_attention``,
tied input/output embeddings, vocabulary padded to a multiple of 64 so the LM head's matmul stays aligned.

Sizes run from ``tiny`` (CPU tests) to GPT-2 XL; ``gpt2`` is the 124M model (12 layers, 768 wide, 12 heads,
vocab 50304, context 1024).  Data is the byte-level stdlib corpus (vocab 256) or synthetic tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ConfigError, hp_get
from trainer.data import TokenBatches, build_stdlib_corpus
from trainer.precision import Precision
from trainer.recipes import Recipe

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 256, "seq_len": 128},
    "mini": {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 256, "seq_len": 256},
    "small": {"n_layer": 6, "n_embd": 384, "n_head": 6, "vocab_size": 256, "seq_len": 256},
    "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50304, "seq_len": 1024},
    "gpt2-medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "vocab_size": 50304, "seq_len": 1024},
    "gpt2-large": {"n_layer": 36, "n_embd": 1280, "n_head": 20, "vocab_size": 50304, "seq_len": 1024},
    "gpt2-xl": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50304, "seq_len": 1024},
}
SIZES["124m"] = SIZES["gpt2"]


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int  # already padded
    seq_len: int
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ConfigError("n_embd must be a multiple of n_head")


def pad_vocab(n: int, multiple: int = 64) -> int:
    return (n + multiple - 1) // multiple * multiple


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        # Test hook (inject_unsupported_op): a data-dependent Python branch, which Dynamo cannot put in one
        # graph; with fullgraph=True the compile fails the way a genuinely unsupported op does.
        self.inject_unsupported = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inject_unsupported and x.sum().item() > 1e30:
            x = x * 2.0
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class HeadLoss(nn.Module):
    """Final LayerNorm, tied LM head and cross-entropy as one module without parameters of its own (they are
    passed in, so the state dict is unchanged): regional compile gives it its own graph, so Inductor fuses
    the fp32 upcast, log-softmax and NLL instead of materialising [tokens, vocab] fp32 tensors."""

    def forward(self, x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, head_w: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(F.layer_norm(x, (x.size(-1),), ln_w, ln_b), head_w)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
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


class GPTRecipe(Recipe):
    name = "gpt"

    def __init__(self, hyperparameters: dict[str, Any]) -> None:
        super().__init__(hyperparameters)
        hp = self.hp
        size = str(hp.get("size", "tiny"))
        if size not in SIZES:
            raise ConfigError(f"unknown gpt size {size!r}; one of {', '.join(SIZES)}")
        base = SIZES[size]
        self.corpus = str(hp.get("corpus", "stdlib"))
        if self.corpus not in ("stdlib", "synthetic"):
            raise ConfigError("corpus must be 'stdlib' or 'synthetic'")
        vocab = 256 if self.corpus == "stdlib" else base["vocab_size"]
        self.cfg = GPTConfig(
            n_layer=hp_get(hp, "n_layer", base["n_layer"], int, lo=1, hi=512),
            n_embd=hp_get(hp, "n_embd", base["n_embd"], int, lo=8, hi=65536),
            n_head=hp_get(hp, "n_head", base["n_head"], int, lo=1, hi=1024),
            vocab_size=pad_vocab(hp_get(hp, "vocab_size", vocab, int, lo=2, hi=1 << 20)),
            seq_len=hp_get(hp, "seq_len", base["seq_len"], int, lo=2, hi=1 << 17),
            dropout=hp_get(hp, "dropout", 0.0, float, lo=0.0, hi=0.9),
        )
        if self.corpus == "stdlib" and self.cfg.vocab_size < 256:
            raise ConfigError("the byte-level corpus needs vocab_size >= 256")
        self.batch_size = hp_get(hp, "batch_size", 8, int, lo=1, hi=1 << 16)
        self.corpus_bytes = hp_get(hp, "corpus_bytes", 4 << 20, int, lo=1 << 12)

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
        return TokenBatches(tokens=tokens, vocab_size=self.cfg.vocab_size, batch_size=self.batch_size,
                            seq_len=self.cfg.seq_len, rank=rank, world_size=world_size, seed=seed)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return gpt_loss(model, x, y)

    def poison(self, batch: Any) -> Any:
        # Every target becomes byte/token 0, which never follows anything in the corpus: a trained model
        # puts almost no mass on it, so the loss jumps far above its moving average.
        x, y = batch
        return x, torch.zeros_like(y)

    def items_per_batch(self) -> int:
        return self.batch_size * self.cfg.seq_len

    def param_count(self) -> int:
        c = self.cfg
        h = c.n_embd
        per_block = 2 * 2 * h + 3 * h * h + h * h + 4 * h * h + 4 * h * h  # 2 LNs (w+b) + attn + mlp
        return c.vocab_size * h + c.seq_len * h + c.n_layer * per_block + 2 * h  # tied head; ln_f

    def flops_per_item(self) -> float:
        # PaLM appendix B: 6N (N without the position embedding) + attention 12 * L * H * T per token.
        c = self.cfg
        n = self.param_count() - c.seq_len * c.n_embd
        return 6.0 * n + 12.0 * c.n_layer * c.n_embd * c.seq_len

    def activation_bytes(self, precision: Precision, compiled: bool) -> int:
        """Bytes alive for backward at the training peak (the start of backward) of one micro-batch.

        Per layer and token (h = width): the fp32 residual stream into each LayerNorm (2 x 4h), and in the
        compute dtype the matmul inputs (ln outputs 2 x h, attention output h, GELU output 4h), q/k/v (3h),
        the SDPA output (h) and the MLP pre-activation (4h); eager autocast also keeps fp32 LN outputs.
        Inductor recomputes the LayerNorms and GELU from saved inputs, so compiled blocks save less.

        The head dominates at GPT-2's vocabulary: per logit, eager keeps log-softmax's fp32 output for
        backward and, at the peak, its fp32 incoming gradient and fp32 result side by side (3 x 4 bytes; the
        compute-dtype logits are already freed).  Compiled (HeadLoss is a region in both compile modes),
        Inductor saves only the matmul's compute-dtype logits (the softmax is recomputed from them and the
        per-row log-sum-exp) and writes the logits' gradient in the compute dtype: 2 x e bytes per logit.
        Plus the tied head weight's gradient (fp32), produced first in backward.
        """
        c = self.cfg
        tokens = self.batch_size * c.seq_len
        e = 4 if precision == "fp32" else 2
        h = c.n_embd
        if compiled:
            per_tok_layer = 2 * 4 * h + e * (3 * h + h + h + 4 * h) + e * 4 * h
        else:
            per_tok_layer = 2 * 4 * h + e * (2 * h + h + 4 * h + 3 * h + h + 4 * h)
            if precision != "fp32":
                per_tok_layer += 2 * 4 * h
        blocks = tokens * per_tok_layer * c.n_layer
        per_logit = 2 * e if compiled else 3 * 4
        head = tokens * (4 * h + e * h) + tokens * c.vocab_size * per_logit + 4 * c.vocab_size * h
        return blocks + head

    def eager_check_bytes(self, precision: Precision) -> int:
        """The breaker's eager reference forward (no grad): logits in the compute dtype, their fp32 upcast
        and log-softmax's fp32 output at once (fp32 runs skip the upcast)."""
        c = self.cfg
        per_logit = 4 + 4 if precision == "fp32" else 2 + 4 + 4
        return self.batch_size * c.seq_len * c.vocab_size * per_logit
