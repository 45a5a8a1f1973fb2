"""The training loop: ties recipe, parallelism, compile breaker, precision, guards, checkpoints,
preemption and telemetry together.

Throughput rule: the loop never waits for the GPU on the hot path.  Loss and grad norm of step ``s`` are
copied to pinned host memory behind the step (stream-ordered, no wait) with an event recorded after it, and read
once that event has completed, after two more steps are queued (``LOSS_LAG_STEPS`` on CUDA; none on CPU, where
every op is synchronous anyway). ``.item()`` would not do: its copy joins the end of the stream, so it waits for
every step queued so far and the GPU idles while the host launches the next one. A non-finite step is skipped on
the device itself (fused AdamW's ``found_inf``), so the guard and telemetry cost no pipeline bubble.  A step's time
is the interval between its event and the previous step's (the GPU's own clock), so steps read together after a
drain still get their own times.  Cross-rank agreement (stop, time-based checkpoint)
goes through a gloo group on the host.
"""

from __future__ import annotations

import collections
import gc
import os
import pathlib
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from core.fence import fence_names
from core.spec import JobSpec
from core.telemetry import Telemetry
from core.trainer_protocol import ENV_FENCING_TOKEN, ExitCode, RecordKind
from trainer import early_cuda, memory
from trainer.builders import (
    ALLCLOSE,
    build_compiler,
    build_optimizer,
    checkpoint_root,
    compile_cache_dir,
    compile_mode,
    local_tier_root,
    peak_flops,
    persist_compiler_caches,
    plan_memory,
)
from trainer.checkpoint import DURABLE, Checkpointer, FencedError
from trainer.checkpoint.final import save_durably
from trainer.compile import CompileReport
from trainer.config import TrainerConfig
from trainer.determinism import enable_determinism
from trainer.gemm_check import check_gemms, fall_back, usable_precision
from trainer.guards import SpikeGuard
from trainer.lease import LeaseGuard
from trainer.parallel import DistEnv, wrap
from trainer.precision import PrecisionContext, resolve
from trainer.preemption import PreemptionFlag
from trainer.readback import StepReadback
from trainer.recipes import Recipe, load_recipe
from trainer.step import Pending, StepParts, queue_readback, train_step
from trainer.telemetry import NvmlSampler
from trainer.user_error import user_code
from trainer.user_recipe import UserRecipe

# Steps queued on the GPU before the loop reads a loss (waits for its event): the host runs this many steps ahead,
# so a stall of its own (a collection, a telemetry write, a lease renewal) shorter than that much GPU time costs the
# GPU nothing. The loss guard sees each loss two steps late, which changes nothing it decides (a save drains every
# pending step first). (The H200 figures before 2026-12-01 read losses with ``.item()``, which waited for the whole
# queue: the host never ran ahead then.)
LOSS_LAG_STEPS = 2
GC_EVERY_STEPS = 50  # the loop's own young-generation collection (automatic collection is off while it runs)


class Trainer(StepReadback):
    """One rank's training run: ``setup`` builds its pieces, ``train`` resumes and runs the loop to its end."""

    def __init__(self, spec: JobSpec, run_dir: pathlib.Path, env: DistEnv, tel: Telemetry) -> None:
        self.spec, self.run_dir, self.env, self.tel = spec, run_dir, env, tel
        with user_code("reading the hyperparameters"):
            self.cfg = TrainerConfig.from_spec(spec)
        self.recipe: Recipe
        assert spec.recipe is not None  # TrainerConfig.from_spec refused a script's spec
        if spec.code is not None:  # the team's own code: its module's errors are its own (UserError)
            self.recipe = UserRecipe(spec, run_dir)
        else:
            with user_code(f"loading recipe {spec.recipe.name!r}"):
                self.recipe = load_recipe(spec.recipe.name, spec.recipe.hyperparameters)
        self.eval_metrics: dict[str, float] | None = None  # the last evaluation's (user code with ``evaluate``)
        self.device = env.device
        if spec.deterministic:  # before the first GEMM (the check below): cuBLAS reads it once
            tel.event("DETERMINISTIC", enable_determinism())
        self.compile_mode = compile_mode(spec, self.device)
        t0 = time.perf_counter()
        cuda_warm_s = early_cuda.wait()  # the precision check's GEMMs need the context it was creating
        # Checked, not assumed: under an MPS SM cap cuBLAS's bf16 GEMMs come out NaN (trainer/gemm_check.py).
        self.gemms = usable_precision(
            resolve(spec.precision, self.device), self.device, tel, compiled=self.compile_mode != "off"
        )
        self.prec = PrecisionContext.create(self.gemms.precision, self.device, tf32=self.gemms.tf32)
        # Where a start's time goes before the compile (reported as the SETUP_TIMES diagnostic).
        self.setup_s: dict[str, float] = {"precision_check_s": round(time.perf_counter() - t0, 3)}
        if cuda_warm_s is not None:
            self.setup_s["cuda_warm_thread_s"] = cuda_warm_s
        token = os.environ.get(ENV_FENCING_TOKEN)
        self.token = int(token) if token else None
        self.ckpt_root = checkpoint_root(run_dir)
        self.cache_dir = compile_cache_dir(run_dir)
        persist_compiler_caches(self.cache_dir)
        if not fence_names(self.ckpt_root, self.token):
            raise FencedError(f"fence does not name token {self.token} at start")
        self.lease = LeaseGuard.from_env(
            token=self.token, fence_ok=lambda: fence_names(self.ckpt_root, self.token), telemetry=tel
        )
        self.phase = "init"
        self.step = 0
        # The loss of step ``self.step``: set by each step, and by a resume from the checkpoint's own record,
        # so that a resumed attempt that trains no further step still reports its state's loss.
        self.final_loss: float | None = None
        self.last_sync_latency: float | None = None
        self.report: CompileReport | None = None
        self.final_durable = False  # the final checkpoint is committed to the durable tier (``_save_final``)

    # ---- set-up: the builders, in order -------------------------------------------------------------
    def setup(self) -> None:
        """The model (placed, its parallel layout chosen), the checkpointer (verifying ahead while the model
        compiles), the data, the compile, then the wrapped model and its optimizer."""
        cap = memory.apply_memory_cap(self.device)
        torch.manual_seed(self.spec.seed)
        model, blocks = self._build_model(cap)
        self.ckpt = self._build_checkpointer()
        self.ckpt.verify_ahead()  # the newest checkpoints are hashed while the model compiles
        first_batch = self._build_data()
        self.tel.diagnostic(
            "SETUP_TIMES", "set-up before the compile", **{k: round(v, 3) for k, v in self.setup_s.items()}
        )
        self.phase = "compiling"
        self._compile(model, first_batch)
        self.raw_model = model
        self.model = wrap(model, blocks, strategy=self.strategy, env=self.env, precision=self.prec)
        self.optimizer, self.fused = build_optimizer(self.model, self.cfg)
        self.guard = SpikeGuard(self.cfg.guard)
        self.flops = peak_flops(self.device, self.prec.precision, self.cfg.peak_flops)

    def _build_model(self, cap: float | None) -> tuple[nn.Module, list[nn.Module]]:
        """The recipe's model on the device, and its repeated blocks; the parallel layout chosen for its size."""
        recipe = self.recipe
        t0 = time.perf_counter()
        with user_code("building the model"):
            model = recipe.build_model()
            blocks = recipe.blocks(model)
            compiled = self.compile_mode != "off"
            sizes = {
                "param_count": recipe.param_count(),
                "activation_bytes": recipe.activation_bytes(self.prec.precision, compiled),
                "check_bytes": recipe.eager_check_bytes(self.prec.precision) if compiled else 0,
            }
        t1 = time.perf_counter()
        model = model.to(self.device)
        t2 = time.perf_counter()
        self.setup_s.update(build_s=t1 - t0, to_device_s=t2 - t1)
        largest = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
        self.strategy, self.prediction, self.cuda_graphs = plan_memory(
            self.spec,
            self.env,
            self.tel,
            precision=self.prec.precision,
            grad_accum=self.cfg.grad_accum,
            sizes=sizes,
            largest=largest,
            cap=cap,
        )
        return model, blocks

    def _build_checkpointer(self) -> Checkpointer:
        spec, env = self.spec, self.env
        sharded = self.strategy == "fsdp" and env.distributed
        return Checkpointer(
            self.ckpt_root,
            rank=env.rank,
            world_size=env.world_size,
            token=self.token,
            keep_last=spec.checkpointing.keep_last,
            asynchronous=spec.checkpointing.asynchronous,
            sharded=sharded,
            group=env.ckpt,
            device=self.device,
            telemetry=self.tel,
            local_root=local_tier_root(spec, env, self.tel, sharded),
            persist_every=spec.checkpointing.persist_every,
            lease=self.lease.ensure,
        )

    def _build_data(self) -> Any:
        """This rank's data, and its first batch (the compile's warm-up runs on it)."""
        recipe, env = self.recipe, self.env
        t3 = time.perf_counter()
        with user_code("building the data"):
            self.data = recipe.make_data(rank=env.rank, world_size=env.world_size, seed=self.spec.seed)
            first_batch = self.data.batch(0)
        if isinstance(recipe, UserRecipe):
            recipe.note_batch(first_batch)
        self.setup_s.update(data_s=time.perf_counter() - t3)
        return first_batch

    def _compile(self, model: nn.Module, first_batch: Any) -> None:
        """The compile, forced by a warm-up step on the first batch (the RNG untouched); a fallback to eager where
        eager's GEMMs are the wrong ones trains in fp32 instead."""
        recipe = self.recipe
        warm_batch = recipe.batch_to(first_batch, self.device)
        compiler = build_compiler(
            self.spec,
            self.cfg,
            self.env,
            self.tel,
            mode=self.compile_mode,
            cuda_graphs=self.cuda_graphs,
            model_name=recipe.name,
            cache_dir=self.cache_dir,
            strategy=self.strategy,
            triton_gemms=self.gemms.triton_gemms,
        )
        rtol, atol = ALLCLOSE[self.prec.precision]
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):

            def warm_loss() -> torch.Tensor:
                with self.prec.autocast():
                    return recipe.loss(model, warm_batch)

            self.report = compiler.compile(
                model,
                recipe.compile_regions(model),
                loss_fn=warm_loss,
                precision=self.prec.precision,
                model_config=recipe.graph_config(),
                rtol=rtol,
                atol=atol,
            )
        if self.gemms.triton_gemms and not self.report.active:
            # Eager GEMMs are cuBLAS's, the ones that are wrong here: the job trains in fp32 instead.
            why = f"the compile fell back to eager ({self.report.reason}), whose {self.prec.precision} GEMMs are wrong"
            self.gemms = fall_back(self.prec.precision, self.device, self.tel, why, check=check_gemms)
            self.prec = PrecisionContext.create(self.gemms.precision, self.device, tf32=self.gemms.tf32)

    # ---- the loop -------------------------------------------------------------------------------------
    def train(self) -> ExitCode:
        self.setup()
        tel = self.tel
        path = self.ckpt.choose()
        if path is not None:
            self.restore(path)
            self._resumed(path)
        # A resume from the final checkpoint has nothing to save, if that checkpoint is already durable.
        self.final_durable = path is not None and self.step == self.spec.steps and self.ckpt.tier_of(path) == DURABLE
        flag = PreemptionFlag()
        flag.install()
        tel.every(self.cfg.heartbeat_s, self._heartbeat, "heartbeat")
        self._heartbeat()
        if self.device.type == "cuda":
            try:
                sampler = NvmlSampler(self.device.index or 0)
                tel.every(self.cfg.gpu_sample_s, lambda: tel.emit(RecordKind.GPU_SAMPLE, **sampler.sample()), "nvml")
            except Exception as exc:
                tel.event("NVML_UNAVAILABLE", f"no NVML samples: {exc!r}")
        # Python's automatic collector walks the compiler's millions of objects at moments of its choosing, each
        # time stalling the step that triggers it; the loop collects the young generation at a fixed cadence
        # instead (as torchtitan does), with everything built before training frozen out of the way.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            return self._loop(flag)
        finally:
            gc.enable()
            flag.restore()

    def _loop(self, flag: PreemptionFlag) -> ExitCode:
        spec, env, cfg = self.spec, self.env, self.cfg
        lag = LOSS_LAG_STEPS if self.device.type == "cuda" else 0
        pending: collections.deque[Pending] = collections.deque()
        # Where each queued step's loss and grad norm land on the host (pinned, so the copy is asynchronous): a
        # ring longer than the queue, so a slot is rewritten only after its step has been read.
        ring = torch.empty((lag + 2, 2), dtype=torch.float32, pin_memory=True) if lag else None
        every_steps = spec.checkpointing.every_steps
        every_s = spec.checkpointing.every_seconds
        last_ckpt_t = time.monotonic()
        parts = self._start_training()
        staged = False
        while self.step < spec.steps:
            self.lease.ensure(f"step {self.step + 1}")  # one clock read while the lease is valid
            if self.step % GC_EVERY_STEPS == 0:
                gc.collect(1)
            self._note_overhead(self.ckpt.io_in_flight())
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # last step's graph outputs may be overwritten now
            index, loss_sum, gn = train_step(parts, self.lr_at(self.step))
            self.step += 1
            if not staged:
                # Start-up, not a save: lay out and pin the checkpoint staging buffers once AdamW's state
                # exists (after the first step), so no save ever pays the ~1 s of pinning 1.5 GB.
                self.ckpt.prepare(self.model, self.optimizer)
                staged = True
            pending.append(queue_readback(self.step, index, loss_sum, gn, ring))
            if cfg.hooks.sleep_per_step_s:
                time.sleep(cfg.hooks.sleep_per_step_s)
            if cfg.hooks.hang_at_step and self.step == cfg.hooks.hang_at_step:
                _hang_forever()
            if self._drain(pending, lag):
                continue  # rolled back: self.step and the data position were restored
            if env.distributed and self.step % cfg.probe_every_steps == 0:
                self._probe_sync()
            due = bool(every_steps and self.step % every_steps == 0)
            stop, timed = self._agree(flag.requested, bool(every_s and time.monotonic() - last_ckpt_t >= every_s))
            if stop or due or timed or self.step == spec.steps:
                if self._drain(pending, 0):  # the guard sees every step before its state is saved
                    continue
                self._checkpoint(stop)
                last_ckpt_t = time.monotonic()
                self.phase = "training"
                if stop:
                    self.tel.event(
                        "PREEMPTED",
                        f"signal {flag.signum}: checkpointed step {self.step}, exiting",
                        step=self.step,
                        signal=flag.signum,
                    )
                    return ExitCode.PREEMPTED
        self._drain(pending, 0)
        self.ckpt.finish()
        if not self.final_durable:  # resumed from a final checkpoint of the local tier only: make it durable
            self._save_final()
        self.phase = "done"
        self._done()
        return ExitCode.SUCCEEDED

    def _start_training(self) -> StepParts:
        """The counters the readback keeps, zeroed, and what every step works with."""
        cfg = self.cfg
        self.last_event = None
        self.nonfinite_streak = 0  # steps in a row whose update was skipped
        self.last_done_t = time.perf_counter()
        self.tokens_done = 0
        self.items_per_step = self.recipe.items_per_batch() * cfg.grad_accum * self.env.world_size
        self.flops_per_item = self.recipe.flops_per_item()
        self.t_start = time.perf_counter()
        self.phase = "training"
        self.overhead = "restore" if self.step else None  # kiln's own work since the last report
        return StepParts(
            model=self.model,
            optimizer=self.optimizer,
            fused=self.fused,
            recipe=self.recipe,
            data=self.data,
            prec=self.prec,
            cfg=cfg,
            env=self.env,
            ckpt=self.ckpt,
            params=[p for p in self.model.parameters() if p.requires_grad],
            poisoned={b + i for b in cfg.hooks.loss_spike_at_step for i in range(cfg.hooks.loss_spike_len)},
        )

    def _checkpoint(self, stop: bool) -> None:
        """A checkpoint that is due: the user's evaluation first (a preemption checkpoints at once; the next
        attempt evaluates), the final one durably, a preemption's blocking."""
        if not stop:
            self._evaluate()
        self.phase = "checkpointing"
        if self.step == self.spec.steps and not stop:
            self._save_final()
        else:
            self.ckpt.save(self.step, self.model, self.optimizer, self.extra_state(), blocking=stop)
        self._note_overhead("save")  # the save's stall falls into the next reported step's time

    def _save_final(self) -> None:
        """The job's final state, committed to the durable tier, or ``StorageUnwritable`` (exit STORAGE_ERROR):
        the job is SUCCEEDED only with it (``trainer.checkpoint.final``)."""
        self.ckpt.wait()  # a failure of an earlier asynchronous save is its own event, not this save's
        self.ckpt.wait_persist()
        self.ckpt.take_failure()

        def save() -> BaseException | None:
            self.ckpt.save(self.step, self.model, self.optimizer, self.extra_state(), blocking=True)
            return self.ckpt.take_failure()

        save_durably(save, step=self.step, tel=self.tel if self.env.rank == 0 else None, agree=self._agree)
        self.final_durable = True

    def _evaluate(self) -> None:
        """The user's evaluation, before each checkpoint (so the metrics are saved with the state they score)."""
        recipe = self.recipe
        if not (isinstance(recipe, UserRecipe) and recipe.evaluates):
            return
        self.phase = "evaluating"
        model = self.model if self.strategy == "fsdp" and self.env.distributed else self.raw_model
        with self.prec.autocast():
            self.eval_metrics = recipe.evaluate(
                model, rank=self.env.rank, world_size=self.env.world_size, group=self.env.ctrl
            )
        self.tel.emit(RecordKind.EVAL, step=self.step, metrics=self.eval_metrics)
        self._note_overhead("save")

    def _agree(self, stop: bool, timed: bool) -> tuple[bool, bool]:
        if not self.env.distributed:
            return stop, timed
        t = torch.tensor([int(stop), int(timed)], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.env.ctrl)
        return bool(t[0]), bool(t[1])

    def _probe_sync(self) -> None:
        """Gradient-sync latency: a one-element all-reduce on the training group, timed end to end."""
        x = torch.ones(1, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last_sync_latency = time.perf_counter() - t0

    def _heartbeat(self) -> None:
        cuda_ok: bool | None = None
        if self.device.type == "cuda":
            try:
                torch.cuda.mem_get_info(self.device)  # a driver call: fails once the context is broken
                cuda_ok = True
            except Exception:
                cuda_ok = False
        self.tel.emit(
            RecordKind.HEARTBEAT,
            alive=True,
            step=self.step,
            phase=self.phase,
            cuda_ok=cuda_ok,
            nccl_error=None,
            grad_sync_latency_s=self.last_sync_latency,
            backend=self.env.backend,
        )

    def _done(self) -> None:
        elapsed = time.perf_counter() - self.t_start
        meas = memory.measured(self.device)
        pred = self.prediction["predicted_peak_bytes"]
        err = (pred - meas["mem_peak_bytes"]) / meas["mem_peak_bytes"] if meas["mem_peak_bytes"] else None
        rep = self.report
        # steps and final_loss are those of the last checkpoint (the final save, or the one resumed from when
        # no step was left): what the job's record must equal.
        self.tel.emit(
            RecordKind.DONE,
            final_loss=self.final_loss,
            steps=self.step,
            elapsed_s=elapsed,
            tokens_per_s=self.tokens_done / elapsed if elapsed > 0 else None,
            strategy=self.strategy,
            precision=self.prec.precision,
            compile={
                "mode": rep.mode,
                "active": rep.active,
                "reason": rep.reason,
                "elapsed_s": rep.elapsed_s,
                "cache_hit": rep.cache_hit,
            }
            if rep
            else None,
            predicted_peak_bytes=pred,
            measured_peak_bytes=meas["mem_peak_bytes"],
            memory_prediction_error=err,
            overflow_rate=self.prec.overflow_rate,
            spikes=self.guard.spikes,
            checkpoints=self.ckpt.saves,
            exit_code=int(ExitCode.SUCCEEDED),
            eval=self.eval_metrics,
            checkpoints_persisted=self.ckpt.persisted,
            checkpoint_failures=self.ckpt.failures,
        )


def _hang_forever() -> None:
    """The ``hang_at_step`` test hook: a loop stuck as in a collective that never returns. The heartbeat thread
    ticks on and the SIGTERM handler only sets a flag nobody reads; only SIGKILL ends it."""
    while True:
        time.sleep(3600)
