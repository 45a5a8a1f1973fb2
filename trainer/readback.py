"""Reading finished steps back from the device: step times, throughput and MFU, the STEP records, non-finite
steps skipped (too many in a row: the run has diverged), and the loss guard's rollbacks."""

from __future__ import annotations

import collections
import math
import time

import torch

from core.trainer_protocol import RecordKind
from trainer import memory
from trainer.guards import Spike
from trainer.parallel import DistEnv
from trainer.state import TrainerState
from trainer.step import Pending


class TrainingDiverged(RuntimeError):
    """Too many loss spikes, or too many non-finite steps in a row: exit TOO_MANY_SPIKES with this line."""


class StepReadback(TrainerState):
    """The ``Trainer``'s reading of finished steps (its attributes are set by ``Trainer``)."""

    env: DistEnv
    phase: str
    last_done_t: float
    last_event: torch.cuda.Event | None
    items_per_step: int
    tokens_done: int
    flops_per_item: float
    flops: float | None
    nonfinite_streak: int

    def _drain(self, pending: collections.deque[Pending], keep: int) -> bool:
        """Read finished steps (all but the newest ``keep``); True if a spike made us roll back."""
        cfg = self.cfg
        while len(pending) > keep:
            step, index, values, event = pending.popleft()
            if event is not None:
                event.synchronize()  # this step's work only, not the steps queued behind it
            loss, gn = values.tolist()
            now = time.perf_counter()
            dt = now - self.last_done_t
            if event is not None and self.last_event is not None:
                dt = self.last_event.elapsed_time(event) / 1e3  # the GPU's clock: steps read together keep theirs
            self.last_done_t, self.last_event = now, event
            items = self.items_per_step
            self.tokens_done += items
            rate = items / dt if dt > 0 else None
            mfu = self.flops_per_item * rate / (self.flops * self.env.world_size) if rate and self.flops else None
            if not (math.isfinite(loss) and math.isfinite(gn)):
                self.nonfinite_streak += 1
                self.tel.event(
                    "NONFINITE_SKIPPED",
                    f"step {step}: non-finite loss/grad norm, update skipped",
                    step=step,
                    batch=index,
                    loss=loss,
                    grad_norm=gn,
                )
                if self.nonfinite_streak >= cfg.guard.max_nonfinite_steps:
                    self._give_up_nonfinite(step)
                continue
            self.nonfinite_streak = 0
            overhead, self.overhead = self.overhead, None
            if step % cfg.log_every == 0 or step == self.spec.steps:
                self.tel.emit(
                    RecordKind.STEP,
                    step=step,
                    batch=index,
                    loss=loss,
                    grad_norm=gn,
                    tokens_per_s=rate,
                    step_time_s=dt,
                    mfu=mfu,
                    lr=self.lr_at(step - 1),
                    overhead=overhead,
                    **memory.measured(self.device),
                )
            self.final_loss = loss
            spike = self.guard.observe(step, index, loss, gn)
            if spike is not None:
                pending.clear()
                self._rollback(spike)
                return True
        return False

    def _give_up_nonfinite(self, step: int) -> None:
        """No update has been applied for ``max_nonfinite_steps`` steps: the run is not training any more, and
        must not end SUCCEEDED with the last finite loss (as a 30%-SM share on the H200 once did, for 600 steps)."""
        n, limit = self.nonfinite_streak, self.cfg.guard.max_nonfinite_steps
        last = f"{self.final_loss:.4g}" if self.final_loss is not None else "none"
        line = (
            f"training diverged: the loss or grad norm was non-finite for {n} steps in a row (steps {step - n + 1}-"
            f"{step}, none applied; max_nonfinite_steps={limit}); the last finite loss: {last}"
        )
        self.tel.event("TOO_MANY_NONFINITE", line, steps=n, last_step=step, max_nonfinite_steps=limit)
        raise TrainingDiverged(line)

    def _rollback(self, spike: Spike) -> None:
        tel = self.tel
        tel.event(
            "LOSS_SPIKE",
            f"loss spike confirmed over steps {list(spike.steps)}",
            step=spike.first_step,
            steps=list(spike.steps),
            batches=list(spike.batches),
            loss=spike.loss,
            loss_moving_avg=spike.loss_mean,
            grad_norm=spike.grad_norm,
            grad_norm_moving_avg=spike.grad_mean,
            factor=self.cfg.guard.factor,
            spikes=self.guard.spikes,
        )
        if self.guard.spikes > self.cfg.guard.max_spikes:
            tel.event(
                "TOO_MANY_SPIKES",
                f"{self.guard.spikes} spikes > max_spikes={self.cfg.guard.max_spikes}",
                spikes=self.guard.spikes,
            )
            raise TrainingDiverged(
                f"training diverged: {self.guard.spikes} loss spikes, over max_spikes={self.cfg.guard.max_spikes}"
            )
        self.phase = "rolling_back"
        skip = set(self.data.skip) | set(spike.batches)
        removed = self.ckpt.delete_from(spike.first_step)
        path = self.ckpt.choose(before_step=spike.first_step)
        if path is not None:
            self.restore(path)
        else:
            self.reset_to_init()
        self.data.skip |= skip
        self.last_done_t, self.last_event = time.perf_counter(), None
        self._note_overhead("restore")
        tel.event(
            "ROLLED_BACK",
            f"rolled back to step {self.step}; skipping batches {sorted(spike.batches)}",
            to_step=self.step,
            path=str(path) if path else None,
            skipped_batches=sorted(spike.batches),
            removed_checkpoints=removed,
            tier=self.ckpt.tier_of(path) if path else None,
        )
        self.phase = "training"
