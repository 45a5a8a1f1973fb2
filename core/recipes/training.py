"""What every built-in recipe shares: the optimiser, schedule, guard and telemetry settings, typed.

Each recipe's own model (``core.recipes.gpt``, ``core.recipes.mlp``) extends ``TrainingHyperparameters``; the
API validates a spec's ``recipe.hyperparameters`` against it at submit (no torch needed), and the trainer reads
the same model, so a misspelt or out-of-range setting is refused before the job queues, never ignored.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from pydantic import BaseModel, ConfigDict, Field

Finite = Field(allow_inf_nan=False)


class TrainingHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: Annotated[float, Finite, Field(ge=0.0, le=10.0, description="Peak learning rate (AdamW).")] = 3e-4
    min_lr_ratio: Annotated[float, Finite, Field(ge=0.0, le=1.0, description="Cosine floor, of lr.")] = 0.1
    warmup_steps: Annotated[int | None, Field(ge=0, le=10_000_000, description="Default: 10% of steps, <= 100.")] = None
    weight_decay: Annotated[float, Finite, Field(ge=0.0, le=10.0)] = 0.1
    beta1: Annotated[float, Finite, Field(ge=0.0, le=1.0)] = 0.9
    beta2: Annotated[float, Finite, Field(ge=0.0, le=1.0)] = 0.95
    grad_clip: Annotated[float, Finite, Field(ge=0.0, le=1e6, description="0 = no clipping.")] = 1.0
    grad_accum: Annotated[int, Field(ge=1, le=1024, description="Micro-batches per optimizer step.")] = 1
    log_every: Annotated[int, Field(ge=1, le=1_000_000, description="Steps between telemetry records.")] = 1
    heartbeat_s: Annotated[float, Finite, Field(ge=0.05, le=3600)] = 5.0
    gpu_sample_s: Annotated[float, Finite, Field(ge=0.05, le=3600)] = 5.0
    probe_every_steps: Annotated[int, Field(ge=1, le=1_000_000, description="Gradient-sync latency probe.")] = 50
    peak_flops: Annotated[float | None, Finite, Field(ge=1.0, le=1e18, description="Per GPU, for MFU.")] = None
    spike_guard: bool = True
    spike_window: Annotated[int, Field(ge=3, le=10_000)] = 20
    spike_factor: Annotated[float, Finite, Field(ge=1.01, le=1e6, description="Suspect: loss > factor x avg.")] = 2.0
    spike_grad_z: Annotated[float, Finite, Field(ge=1.0, le=1e6)] = 8.0
    spike_min_loss: Annotated[
        float, Finite, Field(ge=0.0, le=1e6, description="A loss under this is never a spike.")
    ] = 0.05
    spike_confirm_steps: Annotated[int, Field(ge=1, le=100)] = 2
    max_spikes: Annotated[int, Field(ge=0, le=1000, description="Rollbacks before giving up.")] = 3
    max_nonfinite_steps: Annotated[
        int, Field(ge=1, le=100_000, description="Steps in a row with a non-finite loss or grad norm before failing.")
    ] = 20

    def warmup_for(self, steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else min(100, max(1, steps // 10))

    def shape(self) -> RecipeShape:
        raise NotImplementedError  # every recipe's own model says what it builds


class RecipeShape(Protocol):
    """What the memory predictor and the MFU figure need, from the hyperparameters alone (no model built)."""

    def param_count(self) -> int: ...

    def largest_block_params(self) -> int: ...

    def activation_bytes(self, precision: str, compiled: bool) -> int: ...

    def eager_check_bytes(self, precision: str) -> int: ...

    def items_per_batch(self) -> int: ...

    def flops_per_item(self) -> float: ...
