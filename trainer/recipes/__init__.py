"""Recipes: what model to build, what data to feed it and how to score it.

Recipes are found through the ``kiln.recipes`` entry-point group, so a team can ship its own in any installed
package (``[project.entry-points."kiln.recipes"] mine = "pkg.mod:MyRecipe"``).  The built-in ones are also
known by import path so the trainer works from a source checkout that was never pip-installed.
"""

from __future__ import annotations

import abc
import importlib
from importlib.metadata import entry_points
from typing import Any

import torch
from torch import nn

from core.recipes import HyperparameterError, RecipeShape, TrainingHyperparameters, validate
from trainer.config import ConfigError
from trainer.precision import Precision

BUILTIN = {
    "gpt": "trainer.recipes.gpt:GPTRecipe",
    "mlp": "trainer.recipes.mlp:MLPRecipe",
}


class RecipeError(ValueError):
    """Unknown recipe or bad recipe hyperparameters (-> ExitCode.USER_ERROR)."""


class Recipe(abc.ABC):
    """One training recipe.  Instances are cheap; ``build_model`` does the work."""

    name: str = ""

    def __init__(self, hyperparameters: dict[str, Any]) -> None:
        self.hp = dict(hyperparameters)

    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """The model, initialised on the CPU from the current torch RNG state."""

    @abc.abstractmethod
    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated regions: units of regional compile and of FSDP sharding."""

    @abc.abstractmethod
    def make_data(self, *, rank: int, world_size: int, seed: int) -> Any:
        """A batch source with ``next() -> (index, batch)``, ``state_dict()`` and ``load_state_dict()``."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Scalar mean loss of ``model`` on ``batch`` (already on the device)."""

    @abc.abstractmethod
    def poison(self, batch: Any) -> Any:
        """Test hook: a corrupted copy of ``batch`` that a healthy model scores badly."""

    @abc.abstractmethod
    def items_per_batch(self) -> int:
        """Tokens (or samples) one rank processes per micro-batch, for throughput figures."""

    @abc.abstractmethod
    def flops_per_item(self) -> float:
        """Training FLOPs (forward + backward) per token or sample, for MFU."""

    @abc.abstractmethod
    def param_count(self) -> int:
        """Number of parameters, computed from the config alone (no model is built)."""

    @abc.abstractmethod
    def activation_bytes(self, precision: Precision, compiled: bool) -> int:
        """Peak activation bytes of one micro-batch on one rank (for the memory predictor)."""

    def compile_regions(self, model: nn.Module) -> list[nn.Module]:
        """The units of regional compile: the blocks, plus whatever else is worth its own graph (e.g. the
        LM head and loss, whose fp32 logits dominate memory traffic when left eager)."""
        return self.blocks(model)

    def eager_check_bytes(self, precision: Precision) -> int:
        """Transient bytes of the compile breaker's eager, no-grad reference forward (memory predictor)."""
        return 0

    def graph_config(self) -> dict[str, Any]:
        """What identifies the compiled graph (part of the compile-cache key): the hyperparameters but kiln's own
        training settings (optimiser, schedule, guards, telemetry), which never enter the model or its loss, so the
        jobs of a sweep over them share one compiled graph."""
        graph = {k: v for k, v in sorted(self.hp.items()) if k not in TrainingHyperparameters.model_fields}
        return {"recipe": self.name, **graph}

    def batch_to(self, batch: Any, device: torch.device) -> Any:
        non_blocking = device.type == "cuda"
        if isinstance(batch, tuple):
            return tuple((t.pin_memory() if non_blocking else t).to(device, non_blocking=non_blocking) for t in batch)
        return batch.to(device, non_blocking=non_blocking)


class ShapedRecipe(Recipe):
    """A built-in recipe: typed hyperparameters (``core.recipes``) and a shape that does the arithmetic the
    memory predictor and the MFU figure need, shared with the API's submit-time checks."""

    shape: RecipeShape

    def __init__(self, hyperparameters: dict[str, Any]) -> None:
        super().__init__(hyperparameters)
        try:
            params = validate(self.name, self.hp)
        except HyperparameterError as exc:
            raise ConfigError(str(exc)) from None
        assert params is not None
        self.params: TrainingHyperparameters = params

    def items_per_batch(self) -> int:
        return self.shape.items_per_batch()

    def flops_per_item(self) -> float:
        return self.shape.flops_per_item()

    def param_count(self) -> int:
        return self.shape.param_count()

    def activation_bytes(self, precision: Precision, compiled: bool) -> int:
        return self.shape.activation_bytes(precision, compiled)

    def eager_check_bytes(self, precision: Precision) -> int:
        return self.shape.eager_check_bytes(precision)


def load_recipe(name: str, hyperparameters: dict[str, Any]) -> Recipe:
    target: str | None = None
    cls: Any = None
    for ep in entry_points(group="kiln.recipes"):
        if ep.name == name:
            cls = ep.load()
            break
    if cls is None:
        target = BUILTIN.get(name)
        if target is None:
            known = sorted({ep.name for ep in entry_points(group="kiln.recipes")} | set(BUILTIN))
            raise RecipeError(f"unknown recipe {name!r}; known: {', '.join(known)}")
        module, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Recipe)):
        raise RecipeError(f"recipe {name!r} is not a trainer.recipes.Recipe subclass")
    return cls(hyperparameters)
