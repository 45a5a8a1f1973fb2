"""The recipe protocol for a team's own code, version 1 (docs/user-code.md).

A job whose spec has ``code`` runs the module ``code.entry_point`` of its uploaded archive, unpacked by the worker
into the attempt's run directory (``KILN_CODE_DIR``). The module gives:

    KILN_PROTOCOL = 1
    class Hyperparameters(pydantic.BaseModel): ...        # its own settings, typed (kiln's own are taken out first)
    def build_model(hp) -> torch.nn.Module                 # on the CPU, from torch's RNG (kiln seeds it)
    def batches(hp, *, rank, world_size, seed, start) -> Iterator[batch]
        # this rank's batches from batch number ``start`` on; batch i must be a function of (seed, i), so a
        # restarted attempt that asks for ``start=i`` sees what the lost one would have seen
    def loss(model, batch) -> torch.Tensor                  # the scalar mean loss (batch already on the device)
    # optional
    def evaluate(model, hp, *, rank, world_size) -> Mapping[str, float]   # named metrics, e.g. held-out accuracy
    # any of build_model, batches, evaluate may take a keyword ``datasets``: the job's datasets (spec ``datasets``),
    # a read-only mapping name -> pathlib.Path of the directory (mounted read-only by the worker, KILN_DATASETS)
    def items_per_batch(hp) -> int                          # samples or tokens per batch (default: batch's dim 0)
    def flops_per_item(hp) -> float                         # training FLOPs per item for MFU (default 6 x params)
    def blocks(model) -> list[torch.nn.Module]              # repeated regions: regional compile, FSDP2 units

A batch is a tensor or a tuple of tensors. Everything else - optimiser and schedule (kiln's own hyperparameters:
``lr``, ``warmup_steps``, ...), compile with its breaker and cache, DDP/FSDP2, precision, checkpoints, the spike
guard, telemetry - is kiln's, exactly as for the built-in recipes. What the user's functions raise (other than
what a host or device causes) is the user's error: the job fails at once with that line (``trainer.user_error``).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import json
import os
import pathlib
import sys
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel, ValidationError
from torch import nn

from core.recipes import TrainingHyperparameters
from core.spec import JobSpec
from core.trainer_protocol import ENV_CODE_DIR, ENV_DATASETS
from trainer.precision import Precision
from trainer.recipes import Recipe
from trainer.user_error import USER_CODE_ROOTS, UserError, user_code

PROTOCOL_VERSION = 1
REQUIRED = ("Hyperparameters", "build_model", "batches", "loss")


def code_dir(run_dir: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(os.environ.get(ENV_CODE_DIR) or run_dir / "code")


def job_datasets(spec: JobSpec) -> Mapping[str, pathlib.Path]:
    """The job's datasets as the worker made them available (``KILN_DATASETS``): name -> directory, read-only."""
    raw = os.environ.get(ENV_DATASETS)
    given = {str(k): pathlib.Path(v) for k, v in (json.loads(raw) if raw else {}).items()}
    missing = [n for n in spec.datasets if n not in given]
    if missing:
        raise UserError(
            "reading the datasets",
            LookupError(
                f"the spec names datasets {', '.join(missing)} but {ENV_DATASETS} does not give them "
                f'(outside a worker, set {ENV_DATASETS}=\'{{"NAME": "DIR"}}\' to try them locally)'
            ),
        )
    return MappingProxyType(given)


def takes_datasets(fn: Callable[..., Any]) -> bool:
    """Whether a function of the user's asks for the datasets (a parameter named ``datasets``)."""
    try:
        return "datasets" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def import_entry_point(entry_point: str, directory: pathlib.Path) -> ModuleType:
    """The user's module, imported from its unpacked archive (first on the path, so its own modules win)."""
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    if str(directory) not in USER_CODE_ROOTS:
        USER_CODE_ROOTS.append(str(directory))
    with user_code(f"importing your code ({entry_point})"):
        module = importlib.import_module(entry_point)
    version = getattr(module, "KILN_PROTOCOL", None)
    if version != PROTOCOL_VERSION:
        raise UserError(
            f"importing your code ({entry_point})",
            ValueError(f"KILN_PROTOCOL = {version!r}; this kiln speaks recipe protocol {PROTOCOL_VERSION}"),
        )
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise UserError(
            f"importing your code ({entry_point})",
            AttributeError(f"the module has no {', '.join(missing)} (docs/user-code.md)"),
        )
    if not (isinstance(module.Hyperparameters, type) and issubclass(module.Hyperparameters, BaseModel)):
        raise UserError(
            f"importing your code ({entry_point})", TypeError("Hyperparameters must be a pydantic BaseModel subclass")
        )
    return module


def user_hyperparameters(module: ModuleType, hyperparameters: Mapping[str, Any]) -> BaseModel:
    """The user's typed settings: the spec's hyperparameters without kiln's own (``TrainingHyperparameters``)."""
    theirs = {k: v for k, v in hyperparameters.items() if k not in TrainingHyperparameters.model_fields}
    model: type[BaseModel] = module.Hyperparameters
    known = [*model.model_fields, *TrainingHyperparameters.model_fields]
    for key in theirs:  # a misspelt setting is refused, never silently ignored, whatever the model's own config
        if key not in model.model_fields:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(
                "reading the hyperparameters", ValueError(f"recipe.hyperparameters.{key}: unknown hyperparameter{hint}")
            )
    try:
        hp: BaseModel = module.Hyperparameters.model_validate(theirs)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(
            "reading the hyperparameters", ValueError(f"recipe.hyperparameters.{where}: {first['msg']}")
        ) from None
    return hp


class UserBatches:
    """kiln's data position (``cursor``, ``skip``) over the user's resumable iterator: the iterator is asked again
    (``start=cursor``) whenever the position moves other than by one (a resume, a rollback, a skipped batch)."""

    def __init__(
        self,
        module: ModuleType,
        hp: BaseModel,
        *,
        rank: int,
        world_size: int,
        seed: int,
        datasets: Mapping[str, pathlib.Path] | None = None,
    ) -> None:
        self.module, self.hp = module, hp
        self.extra: dict[str, Any] = {"datasets": datasets} if takes_datasets(module.batches) else {}
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.cursor = 0
        self.skip: set[int] = set()
        self._it: Iterator[Any] | None = None
        self._at = -1  # the index the open iterator yields next

    def _open(self, start: int) -> Iterator[Any]:
        with user_code("your batches()"):
            return iter(
                self.module.batches(
                    self.hp, rank=self.rank, world_size=self.world_size, seed=self.seed, start=start, **self.extra
                )
            )

    def _draw(self, it: Iterator[Any], index: int) -> Any:
        with user_code("your batches()"):
            try:
                return next(it)
            except StopIteration:
                raise ValueError(f"the iterator ended before batch {index}") from None

    def batch(self, index: int) -> Any:
        return self._draw(self._open(index), index)

    def next(self) -> tuple[int, Any]:
        while self.cursor in self.skip:
            self.cursor += 1
        index = self.cursor
        if self._it is None or self._at != index:
            self._it = self._open(index)
        batch = self._draw(self._it, index)
        self._at = index + 1
        self.cursor += 1
        return index, batch

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "skip": sorted(self.skip)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.skip = {int(i) for i in state["skip"]}


class UserRecipe(Recipe):
    """A ``Recipe`` over a module that follows the protocol above."""

    def __init__(self, spec: JobSpec, run_dir: pathlib.Path) -> None:
        assert spec.code is not None and spec.code.entry_point is not None and spec.recipe is not None
        super().__init__(spec.recipe.hyperparameters)
        self.name = spec.recipe.name
        self.digest = spec.code.digest
        self.module = import_entry_point(spec.code.entry_point, code_dir(run_dir))
        self.params = user_hyperparameters(self.module, spec.recipe.hyperparameters)
        self.spec = spec
        self._param_count = 0
        self._items: int | None = None

    @functools.cached_property
    def datasets(self) -> Mapping[str, pathlib.Path]:
        """Read when the model or the data first asks: checking the hyperparameters (``kiln submit``'s default
        check, on the user's machine) needs none."""
        return job_datasets(self.spec)

    def build_model(self) -> nn.Module:
        with user_code("your build_model()"):
            model = self.module.build_model(self.params, **self._extra(self.module.build_model))
            if not isinstance(model, nn.Module):
                raise TypeError(f"build_model returned {type(model).__name__}, not a torch.nn.Module")
        self._param_count = sum(p.numel() for p in model.parameters())
        return model

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        if not hasattr(self.module, "blocks"):
            return []  # FSDP2 then shards the model as one unit
        with user_code("your blocks()"):
            return list(self.module.blocks(model))

    def compile_regions(self, model: nn.Module) -> list[nn.Module]:
        return self.blocks(model) or [model]  # no blocks named: the model is one region

    def make_data(self, *, rank: int, world_size: int, seed: int) -> UserBatches:
        return UserBatches(
            self.module, self.params, rank=rank, world_size=world_size, seed=seed, datasets=self.datasets
        )

    def _extra(self, fn: Callable[..., Any]) -> dict[str, Any]:
        return {"datasets": self.datasets} if takes_datasets(fn) else {}

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        with user_code("your loss()"):
            loss: torch.Tensor = self.module.loss(model, batch)
        return loss

    def poison(self, batch: Any) -> Any:
        return batch  # the loss-spike test hook targets the built-in recipes

    def items_per_batch(self) -> int:
        if hasattr(self.module, "items_per_batch"):
            with user_code("your items_per_batch()"):
                return int(self.module.items_per_batch(self.params))
        return self._items or 1

    def note_batch(self, batch: Any) -> None:
        """The default items per batch: the first batch's leading dimension."""
        first = batch[0] if isinstance(batch, (tuple, list)) else batch
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            self._items = int(first.shape[0])

    def flops_per_item(self) -> float:
        if hasattr(self.module, "flops_per_item"):
            with user_code("your flops_per_item()"):
                return float(self.module.flops_per_item(self.params))
        return 6.0 * self._param_count

    def param_count(self) -> int:
        return self._param_count

    def activation_bytes(self, precision: Precision, compiled: bool) -> int:
        return 0  # unknown without the model's own arithmetic: the prediction counts weights and optimiser only

    def graph_config(self) -> dict[str, Any]:
        return {**super().graph_config(), "code": self.digest}

    def batch_to(self, batch: Any, device: torch.device) -> Any:
        if isinstance(batch, list):
            batch = tuple(batch)
        return super().batch_to(batch, device)

    @property
    def evaluates(self) -> bool:
        return hasattr(self.module, "evaluate")

    def evaluate(
        self, model: nn.Module, *, rank: int, world_size: int, group: dist.ProcessGroup | None = None
    ) -> dict[str, float]:
        """The user's metrics, averaged over the ranks (each evaluates its own share, or all of it)."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), user_code("your evaluate()"):
                extra = self._extra(self.module.evaluate)
                raw = self.module.evaluate(model, self.params, rank=rank, world_size=world_size, **extra)
                metrics = {str(k)[:64]: float(v) for k, v in dict(raw).items()}
        finally:
            model.train(was_training)
        if world_size > 1 and dist.is_initialized():
            names = sorted(metrics)
            t = torch.tensor([metrics[n] for n in names], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            metrics = {n: float(v) / world_size for n, v in zip(names, t.tolist(), strict=True)}
        return metrics
