"""The built-in ``gpt`` recipe's hyperparameters and its shape: parameters, activations and FLOPs by arithmetic.

Sizes run from ``tiny`` (CPU tests) to GPT-2 XL; ``gpt2`` is the 124M model (12 layers, 768 wide, 12 heads,
vocabulary 50304, context 1024). The trainer builds the model from ``GPTShape``; the API predicts its memory from
the same numbers at submit.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import Field, model_validator

from core.recipes.training import Finite, TrainingHyperparameters

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 256, "seq_len": 128},
    "mini": {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 256, "seq_len": 256},
    "small": {"n_layer": 6, "n_embd": 384, "n_head": 6, "vocab_size": 256, "seq_len": 256},
    "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50304, "seq_len": 1024},
    "124m": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50304, "seq_len": 1024},
    "gpt2-medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "vocab_size": 50304, "seq_len": 1024},
    "gpt2-large": {"n_layer": 36, "n_embd": 1280, "n_head": 20, "vocab_size": 50304, "seq_len": 1024},
    "gpt2-xl": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50304, "seq_len": 1024},
}
Size = Literal["tiny", "mini", "small", "gpt2", "124m", "gpt2-medium", "gpt2-large", "gpt2-xl"]


def pad_vocab(n: int, multiple: int = 64) -> int:
    """The LM head's matmul stays aligned when the vocabulary is a multiple of 64."""
    return (n + multiple - 1) // multiple * multiple


@dataclasses.dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int  # already padded
    seq_len: int
    batch_size: int
    dropout: float = 0.0

    def block_params(self) -> int:
        h = self.n_embd
        return 2 * 2 * h + 3 * h * h + h * h + 4 * h * h + 4 * h * h  # 2 LNs (w+b) + attention + MLP

    def param_count(self) -> int:
        h = self.n_embd
        return self.vocab_size * h + self.seq_len * h + self.n_layer * self.block_params() + 2 * h  # tied head; ln_f

    def largest_block_params(self) -> int:
        return self.block_params()

    def items_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def flops_per_item(self) -> float:
        # PaLM appendix B: 6N (N without the position embedding) + attention 12 * L * H * T per token.
        n = self.param_count() - self.seq_len * self.n_embd
        return 6.0 * n + 12.0 * self.n_layer * self.n_embd * self.seq_len

    def activation_bytes(self, precision: str, compiled: bool) -> int:
        """Bytes alive for backward at the training peak (the start of backward) of one micro-batch.

        Per layer and token (h = width): the fp32 residual stream into each LayerNorm (2 x 4h), and in the
        compute dtype the matmul inputs (ln outputs 2 x h, attention output h, GELU output 4h), q/k/v (3h),
        the SDPA output (h) and the MLP pre-activation (4h); eager autocast also keeps fp32 LN outputs.
        Inductor recomputes the LayerNorms and GELU from saved inputs, so compiled blocks save less.

        The head dominates at GPT-2's vocabulary: per logit, eager keeps log-softmax's fp32 output for
        backward and, at the peak, its fp32 incoming gradient and fp32 result side by side (3 x 4 bytes; the
        compute-dtype logits are already freed).  Compiled (the head and loss are a region in both compile
        modes), Inductor saves only the matmul's compute-dtype logits (the softmax is recomputed from them and
        the per-row log-sum-exp) and writes the logits' gradient in the compute dtype: 2 x e bytes per logit.
        Plus the tied head weight's gradient (fp32), produced first in backward.
        """
        tokens = self.batch_size * self.seq_len
        e = 4 if precision == "fp32" else 2
        h = self.n_embd
        if compiled:
            per_tok_layer = 2 * 4 * h + e * (3 * h + h + h + 4 * h) + e * 4 * h
        else:
            per_tok_layer = 2 * 4 * h + e * (2 * h + h + 4 * h + 3 * h + h + 4 * h)
            if precision != "fp32":
                per_tok_layer += 2 * 4 * h
        blocks = tokens * per_tok_layer * self.n_layer
        per_logit = 2 * e if compiled else 3 * 4
        head = tokens * (4 * h + e * h) + tokens * self.vocab_size * per_logit + 4 * self.vocab_size * h
        return blocks + head

    def eager_check_bytes(self, precision: str) -> int:
        """The compile breaker's eager reference forward (no grad): logits in the compute dtype, their fp32
        upcast and log-softmax's fp32 output at once (fp32 runs skip the upcast)."""
        per_logit = 4 + 4 if precision == "fp32" else 2 + 4 + 4
        return self.batch_size * self.seq_len * self.vocab_size * per_logit


class GPTHyperparameters(TrainingHyperparameters):
    size: Size = "tiny"
    corpus: Literal["stdlib", "synthetic"] = Field(
        default="stdlib", description="stdlib: the interpreter's own source, byte by byte; synthetic: random tokens"
    )
    n_layer: Annotated[int | None, Field(ge=1, le=512, description="Default: the size's.")] = None
    n_embd: Annotated[int | None, Field(ge=8, le=65536)] = None
    n_head: Annotated[int | None, Field(ge=1, le=1024)] = None
    vocab_size: Annotated[int | None, Field(ge=2, le=1 << 20, description="Default: 256 for stdlib.")] = None
    seq_len: Annotated[int | None, Field(ge=2, le=1 << 17)] = None
    dropout: Annotated[float, Finite, Field(ge=0.0, le=0.9)] = 0.0
    batch_size: Annotated[int, Field(ge=1, le=1 << 16, description="Sequences per rank per micro-batch.")] = 8
    corpus_bytes: Annotated[int, Field(ge=1 << 12, le=1 << 34, description="Bytes of the stdlib corpus.")] = 4 << 20

    @model_validator(mode="after")
    def _consistent(self) -> GPTHyperparameters:
        shape = self.shape()
        if shape.n_embd % shape.n_head:
            raise ValueError(f"n_embd ({shape.n_embd}) must be a multiple of n_head ({shape.n_head})")
        if self.corpus == "stdlib" and shape.vocab_size < 256:
            raise ValueError("the byte-level stdlib corpus needs vocab_size >= 256")
        return self

    def shape(self) -> GPTShape:
        base = SIZES[self.size]
        vocab = self.vocab_size or (256 if self.corpus == "stdlib" else base["vocab_size"])
        return GPTShape(
            n_layer=self.n_layer or base["n_layer"],
            n_embd=self.n_embd or base["n_embd"],
            n_head=self.n_head or base["n_head"],
            vocab_size=pad_vocab(vocab),
            seq_len=self.seq_len or base["seq_len"],
            batch_size=self.batch_size,
            dropout=self.dropout,
        )
