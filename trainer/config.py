"""Turn a JobSpec's free-form recipe hyperparameters into typed, validated settings.

The trainer-level knobs (guards, telemetry cadence, test hooks) live here; recipe-specific knobs (model size,
batch size, corpus) are read by the recipe itself from the same mapping.  Unknown keys are not an error here
because recipes own their own keys, but every key the trainer reads is typed and range-checked.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

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
        guard = GuardConfig(
            enabled=hp_get(hp, "spike_guard", True, bool),
            window=hp_get(hp, "spike_window", 20, int, lo=3, hi=10_000),
            factor=hp_get(hp, "spike_factor", 2.0, float, lo=1.01),
            grad_z=hp_get(hp, "spike_grad_z", 8.0, float, lo=1.0),
            confirm_steps=hp_get(hp, "spike_confirm_steps", 2, int, lo=1, hi=100),
            max_spikes=hp_get(hp, "max_spikes", 3, int, lo=0, hi=1000),
        )
        peak = hp.get("peak_flops")
        return cls(
            lr=hp_get(hp, "lr", 3e-4, float, lo=0.0, hi=10.0),
            min_lr_ratio=hp_get(hp, "min_lr_ratio", 0.1, float, lo=0.0, hi=1.0),
            warmup_steps=hp_get(hp, "warmup_steps", min(100, max(1, spec.steps // 10)), int, lo=0),
            weight_decay=hp_get(hp, "weight_decay", 0.1, float, lo=0.0),
            beta1=hp_get(hp, "beta1", 0.9, float, lo=0.0, hi=1.0),
            beta2=hp_get(hp, "beta2", 0.95, float, lo=0.0, hi=1.0),
            grad_clip=hp_get(hp, "grad_clip", 1.0, float, lo=0.0),
            grad_accum=hp_get(hp, "grad_accum", 1, int, lo=1, hi=1024),
            log_every=hp_get(hp, "log_every", 1, int, lo=1),
            heartbeat_s=hp_get(hp, "heartbeat_s", 5.0, float, lo=0.05),
            gpu_sample_s=hp_get(hp, "gpu_sample_s", 5.0, float, lo=0.05),
            probe_every_steps=hp_get(hp, "probe_every_steps", 50, int, lo=1),
            peak_flops=None if peak is None else hp_get(hp, "peak_flops", None, float, lo=1.0),
            guard=guard,
            hooks=hooks,
        )
