"""Turn a JobSpec's free-form recipe hyperparameters into typed, validated settings.

The trainer-level settings (optimiser, schedule, guards, telemetry cadence) are typed in
``core.recipes.training``; this module turns them into the loop's configuration. Test hooks are not
hyperparameters: they come from the worker's test-only environment (``TestHooks.from_env``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from core.recipes import TrainingHyperparameters, validate
from core.spec import JobSpec
from core.trainer_protocol import ENV_TEST_HOOKS


class ConfigError(ValueError):
    """A hyperparameter that is missing, of the wrong type or out of range (-> ExitCode.USER_ERROR)."""


def training_hyperparameters(spec: JobSpec) -> TrainingHyperparameters:
    """A built-in recipe's typed hyperparameters; for a recipe installed by another package or the team's own code,
    the trainer's own settings read from its mapping (the rest is that recipe's)."""
    if spec.recipe is None:
        raise ConfigError("a `command:` job runs its own script (script mode), not kiln's trainer")
    hp = spec.recipe.hyperparameters
    try:
        params = None if spec.code is not None else validate(spec.recipe.name, hp)
        if params is None:
            ours = {k: v for k, v in hp.items() if k in TrainingHyperparameters.model_fields}
            params = TrainingHyperparameters.model_validate(ours)
    except ValueError as exc:  # HyperparameterError, or pydantic's for another recipe's trainer settings
        raise ConfigError(str(exc)) from None
    return params


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    window: int = 20  # rolling window of accepted steps for the moving average / z-score
    factor: float = 2.0  # a loss above 2x its moving average is a suspect step
    grad_z: float = 8.0  # or grad-norm z-score above this *and* grad norm > factor x its average
    # A step whose loss is under this is never suspect: near zero (a classifier that has learned its data) one hard
    # batch is many times the average loss and its grad norm an outlier, and neither is a sign of divergence.
    min_loss: float = 0.05
    confirm_steps: int = 2  # consecutive suspect steps before acting (a lone blip is not a spike)
    max_spikes: int = 3  # rollbacks allowed before giving up with TOO_MANY_SPIKES
    # Steps in a row whose update was skipped for a non-finite loss or grad norm before giving up the same way: a
    # lone overflow is skipped, but a run that never updates again must not end SUCCEEDED with its last finite
    # loss (the fp16 scaler's back-off from 2^16 skips at most 16 steps in a row).
    max_nonfinite_steps: int = 20


@dataclasses.dataclass(frozen=True)
class TestHooks:
    """Fault injection, for tests only.  Every hook is off unless ``KILN_TEST_HOOKS`` (a JSON object of these
    fields) turns it on: a variable of the worker process that the test harness sets and the worker passes to the
    ranks it launches.  Production never sets it, and no job spec reaches it."""

    loss_spike_at_step: tuple[int, ...] = ()  # batch indices whose targets are poisoned
    loss_spike_len: int = 1  # consecutive poisoned batches from each index
    compile_timeout: bool = False  # make the compile breaker see a compile slower than its limit
    compile_oom: bool = False  # make the breaker see host RSS over its limit
    # put an op Dynamo cannot trace (fullgraph) before each of the model's blocks: a forward pre-hook the compiler
    # installs (trainer.compile), never the recipe's model code
    unsupported_op: bool = False
    nonfinite_at_step: tuple[int, ...] = ()  # batch indices whose loss is made NaN
    sleep_per_step_s: float = 0.0  # slow each step down so a test can signal mid-run
    # The worker's, not the trainer's (read by ``workers.tasks``, accepted here so the shared variable parses):
    # hold each delivered message this long before claiming, so a test can crash the broker while a worker holds
    # an unacknowledged message.
    hold_delivery_s: float = 0.0
    hang_at_step: int = 0  # after this step the loop blocks for good, deaf to SIGTERM (a hung collective)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> TestHooks:
        raw = env.get(ENV_TEST_HOOKS)
        if not raw:
            return cls()
        try:
            fields: dict[str, Any] = json.loads(raw)
            for key in ("loss_spike_at_step", "nonfinite_at_step"):
                if key in fields:
                    fields[key] = tuple(int(i) for i in fields[key])
            return cls(**fields)
        except (ValueError, TypeError, AttributeError) as exc:  # a test's typo must fail loudly, not be ignored
            raise ConfigError(f"{ENV_TEST_HOOKS}={raw!r}: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    grad_accum: int
    log_every: int
    heartbeat_s: float
    gpu_sample_s: float
    probe_every_steps: int
    peak_flops: float | None
    guard: GuardConfig
    hooks: TestHooks

    @classmethod
    def from_spec(cls, spec: JobSpec) -> TrainerConfig:
        params = training_hyperparameters(spec)
        guard = GuardConfig(
            enabled=params.spike_guard,
            window=params.spike_window,
            factor=params.spike_factor,
            grad_z=params.spike_grad_z,
            min_loss=params.spike_min_loss,
            confirm_steps=params.spike_confirm_steps,
            max_spikes=params.max_spikes,
            max_nonfinite_steps=params.max_nonfinite_steps,
        )
        return cls(
            lr=params.lr,
            min_lr_ratio=params.min_lr_ratio,
            warmup_steps=params.warmup_for(spec.steps),
            weight_decay=params.weight_decay,
            beta1=params.beta1,
            beta2=params.beta2,
            grad_clip=params.grad_clip,
            grad_accum=params.grad_accum,
            log_every=params.log_every,
            heartbeat_s=params.heartbeat_s,
            gpu_sample_s=params.gpu_sample_s,
            probe_every_steps=params.probe_every_steps,
            peak_flops=params.peak_flops,
            guard=guard,
            hooks=TestHooks.from_env(),
        )
