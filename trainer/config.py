"""Turn a JobSpec's free-form recipe hyperparameters into typed, validated settings.

The trainer-level settings (optimiser, schedule, guards, telemetry cadence) are typed in
``core.recipes.training``; this module turns them into the loop's configuration, with the test hooks.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from core.recipes import TrainingHyperparameters, validate
from core.spec import JobSpec


class ConfigError(ValueError):
    """A hyperparameter that is missing, of the wrong type or out of range (-> ExitCode.USER_ERROR)."""


def hp_get(hp: dict[str, Any], key: str, default: Any, kind: type, *, lo: float | None = None,
           hi: float | None = None) -> Any:
    """Read ``hp[key]`` as ``kind`` (int/float/str/bool), with bounds; ``default`` when absent or None."""
    value = hp.get(key, default)
    if value is None:
        return default
    try:
        if kind is bool:
            value = value.strip().lower() in {"1", "true", "yes", "on"} if isinstance(value, str) else bool(value)
        elif kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            value = int(value)
        elif kind is float:
            if isinstance(value, bool):
                raise TypeError
            value = float(value)
        else:
            value = kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"hyperparameter {key!r}={value!r} is not a valid {kind.__name__}") from exc
    if lo is not None and value < lo:
        raise ConfigError(f"hyperparameter {key!r}={value!r} must be >= {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"hyperparameter {key!r}={value!r} must be <= {hi}")
    return value


def _int_list(hp: dict[str, Any], key: str) -> tuple[int, ...]:
    value = hp.get(key)
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    try:
        return tuple(int(v) for v in items)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"hyperparameter {key!r} must be an int or a list of ints") from exc


def training_hyperparameters(spec: JobSpec) -> TrainingHyperparameters:
    """A built-in recipe's typed hyperparameters; for a recipe installed by another package, the trainer's own
    settings read from its mapping (the rest is that recipe's)."""
    hp = spec.recipe.hyperparameters
    try:
        params = validate(spec.recipe.name, hp)
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
    factor: float = 2.0  # seed 004: loss > 2x moving average is a suspect step
    grad_z: float = 8.0  # or grad-norm z-score above this *and* grad norm > factor x its average
    confirm_steps: int = 2  # consecutive suspect steps before acting (a lone blip is not a spike)
    max_spikes: int = 3  # rollbacks allowed before giving up with TOO_MANY_SPIKES


@dataclasses.dataclass(frozen=True)
class TestHooks:
    """Fault injection for tests only.  Every hook is off unless a hyperparameter or env var turns it on."""

    loss_spike_at_step: tuple[int, ...] = ()  # batch indices whose targets are poisoned
    loss_spike_len: int = 1  # consecutive poisoned batches from each index
    compile_timeout: bool = False  # make the compile breaker see a compile slower than its limit
    compile_oom: bool = False  # make the breaker see host RSS over its limit
    unsupported_op: bool = False  # put an op Dynamo cannot trace (fullgraph) into the model's blocks
    nonfinite_at_step: tuple[int, ...] = ()  # batch indices whose loss is made NaN
    sleep_per_step_s: float = 0.0  # slow each step down so a test can signal mid-run


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
        hp = spec.recipe.hyperparameters
        env = os.environ
        hooks = TestHooks(
            loss_spike_at_step=_int_list(hp, "inject_loss_spike_at_step")
            or tuple(int(x) for x in env.get("KILN_TEST_INJECT_LOSS_SPIKE_AT_STEP", "").split(",") if x),
            loss_spike_len=hp_get(hp, "inject_loss_spike_len", 1, int, lo=1, hi=1000),
            compile_timeout=hp_get(hp, "inject_compile_timeout", env.get("KILN_TEST_INJECT_COMPILE_TIMEOUT", False),
                                   bool),
            compile_oom=hp_get(hp, "inject_compile_oom", False, bool),
            unsupported_op=hp_get(hp, "inject_unsupported_op", env.get("KILN_TEST_INJECT_UNSUPPORTED_OP", False),
                                  bool),
            nonfinite_at_step=_int_list(hp, "inject_nonfinite_at_step"),
            sleep_per_step_s=hp_get(hp, "test_sleep_per_step_s", 0.0, float, lo=0, hi=60),
        )
        params = training_hyperparameters(spec)
        guard = GuardConfig(
            enabled=params.spike_guard, window=params.spike_window, factor=params.spike_factor,
            grad_z=params.spike_grad_z, confirm_steps=params.spike_confirm_steps, max_spikes=params.max_spikes,
        )  # fmt: skip
        return cls(
            lr=params.lr, min_lr_ratio=params.min_lr_ratio, warmup_steps=params.warmup_for(spec.steps),
            weight_decay=params.weight_decay, beta1=params.beta1, beta2=params.beta2, grad_clip=params.grad_clip,
            grad_accum=params.grad_accum, log_every=params.log_every, heartbeat_s=params.heartbeat_s,
            gpu_sample_s=params.gpu_sample_s, probe_every_steps=params.probe_every_steps,
            peak_flops=params.peak_flops,
            guard=guard,
            hooks=hooks,
        )
