"""The trainer's own state beside the model and the optimizer: what a checkpoint keeps of it, restoring it (and
saying so: RESUMED), a rollback to the initial weights, and the learning-rate schedule."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import torch
from torch import nn

from core.spec import JobSpec
from core.telemetry import Telemetry
from core.trainer_protocol import RecordKind
from trainer.checkpoint import MANIFEST, Checkpointer, sha256_file
from trainer.config import TrainerConfig
from trainer.guards import SpikeGuard
from trainer.precision import PrecisionContext
from trainer.recipes import Recipe


class TrainerState:
    """The ``Trainer``'s state methods (its attributes are set by ``Trainer.__init__`` and ``setup``)."""

    spec: JobSpec
    tel: Telemetry
    cfg: TrainerConfig
    device: torch.device
    recipe: Recipe
    ckpt: Checkpointer
    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: Any
    guard: SpikeGuard
    prec: PrecisionContext
    step: int
    final_loss: float | None
    eval_metrics: dict[str, float] | None
    overhead: str | None

    def lr_at(self, step: int) -> float:
        c = self.cfg
        if c.warmup_steps and step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        span = max(1, self.spec.steps - c.warmup_steps)
        progress = min(1.0, (step - c.warmup_steps) / span)
        return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    def extra_state(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "step": self.step,
            "loss": self.final_loss,
            "data": self.data.state_dict(),
            "guard": self.guard.state_dict(),
            "precision": self.prec.state_dict(),
            "rng": rng,
            "seed": self.spec.seed,
            "eval": self.eval_metrics,
        }

    def restore(self, path: pathlib.Path) -> dict[str, Any]:
        extra = self.ckpt.load(path, self.model, self.optimizer)
        self.step = int(extra["step"])
        self.final_loss = extra.get("loss")  # None in checkpoints written before the loss was kept
        self.eval_metrics = extra.get("eval")
        self.data.load_state_dict(extra["data"])
        self.guard.load_state_dict(extra["guard"])
        self.prec.load_state_dict(extra["precision"])
        torch.set_rng_state(extra["rng"]["cpu"])
        if self.device.type == "cuda" and "cuda" in extra["rng"]:
            torch.cuda.set_rng_state(extra["rng"]["cuda"], self.device)
        return extra

    def reset_to_init(self) -> None:
        """Rollback with no checkpoint before the spike: back to the seed's initial weights, fresh AdamW."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.spec.seed)
            fresh = self.recipe.build_model().state_dict()
        set_model_state_dict(self.model, fresh, options=StateDictOptions(full_state_dict=True))
        self.optimizer.state.clear()
        self.step = 0
        self.final_loss = None
        self.data.load_state_dict({"cursor": 0, "skip": []})
        self.guard.load_state_dict({})

    def _note_overhead(self, kind: str | None) -> None:
        """Remember the heaviest of kiln's own work seen since the last reported step (persist > save > write)."""
        rank = {None: 0, "write": 1, "save": 2, "restore": 3, "persist": 4}
        if rank.get(kind, 0) > rank.get(self.overhead, 0):
            self.overhead = kind

    def _resumed(self, path: pathlib.Path) -> None:
        """Say which checkpoint this attempt continues from, as the control plane records a checkpoint: the
        attempt that committed it may have been cut off before its worker could relay it."""
        manifest = json.loads((path / MANIFEST).read_text())
        self.tel.emit(
            RecordKind.RESUMED,
            step=self.step,
            path=str(path),
            data=self.data.state_dict(),
            tier=self.ckpt.tier_of(path),
            loss=self.final_loss,
            token=manifest.get("fencing_token"),
            created=manifest.get("created"),
            bytes=sum(int(f["bytes"]) for f in manifest["files"].values()),
            sha256=sha256_file(path / MANIFEST),
        )
