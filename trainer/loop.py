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
import contextlib
import gc
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from core import memory as memory_model
from core.fence import fence_names
from core.spec import JobSpec
from core.telemetry import Telemetry
from core.trainer_protocol import (
    ENV_CHECKPOINT_DIR,
    ENV_COMPILE_CACHE_DIR,
    ENV_FENCING_TOKEN,
    ENV_LAUNCHED_AT,
    ENV_LOCAL_CHECKPOINT_DIR,
    ENV_RANK_STARTED_AT,
    ExitCode,
    RecordKind,
)
from trainer import early_cuda, memory
from trainer.checkpoint import DURABLE, MANIFEST, Checkpointer, FencedError, sha256_file
from trainer.checkpoint.final import StorageUnwritable, save_durably
from trainer.compile import Compiler, CompileReport
from trainer.config import TrainerConfig
from trainer.determinism import enable_determinism
from trainer.gemm_check import check_gemms, fall_back, usable_precision
from trainer.guards import Spike, SpikeGuard
from trainer.lease import LeaseExpired, LeaseGuard
from trainer.parallel import DistEnv, choose_strategy, device_capacity, wrap
from trainer.precision import PrecisionContext, resolve
from trainer.preemption import PreemptionFlag
from trainer.recipes import Recipe, load_recipe
from trainer.telemetry import NvmlSampler
from trainer.user_error import UserError, is_collective_failure, user_code
from trainer.user_recipe import UserRecipe

# Dense bf16/fp16 tensor-core peaks (vendor datasheets) for the MFU estimate; override with peak_flops.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}

# Steps queued on the GPU before the loop reads a loss (waits for its event): the host runs this many steps ahead,
# so a stall of its own (a collection, a telemetry write, a lease renewal) shorter than that much GPU time costs the
# GPU nothing. The loss guard sees each loss two steps late, which changes nothing it decides (a save drains every
# pending step first). (The H200 figures before 2026-12-01 read losses with ``.item()``, which waited for the whole
# queue: the host never ran ahead then.)
LOSS_LAG_STEPS = 2
GC_EVERY_STEPS = 50  # the loop's own young-generation collection (automatic collection is off while it runs)

# Tolerances of the compiled-vs-eager first-step loss check, per precision.
ALLCLOSE = {"fp32": (1e-4, 1e-5), "bf16": (2e-2, 1e-3), "fp16": (1e-2, 1e-3)}


class TrainingDiverged(RuntimeError):
    """Too many loss spikes, or too many non-finite steps in a row: exit TOO_MANY_SPIKES with this line."""


def peak_flops(device: torch.device, precision: str, override: float | None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda" or precision == "fp32":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def compile_mode(spec: JobSpec, device: torch.device) -> str:
    """The spec's compile mode unless it is ``auto``: then whole-model on GPU (one graph for the model and
    its loss: measured fastest on the H200, bench/results/trainer_bench.json) and regional on CPU (several
    times quicker to compile, which is what CPU runs and tests are bound by)."""
    if spec.compile.mode != "auto":
        return str(spec.compile.mode)
    return "whole" if device.type == "cuda" else "regional"


def cuda_graphs_on(spec: JobSpec, device: torch.device, strategy: str) -> bool:
    """The spec's ``compile.cuda_graphs`` where graphs can be replayed: on a GPU, unsharded (FSDP2 gathers its
    shards into new buffers each step, which a graph's fixed addresses cannot follow)."""
    return spec.compile.cuda_graphs and device.type == "cuda" and strategy != "fsdp"


def checkpoint_root(run_dir: pathlib.Path) -> pathlib.Path:
    """The job's durable checkpoint directory: the worker names it; a bare run keeps it in the run dir."""
    return pathlib.Path(os.environ.get(ENV_CHECKPOINT_DIR) or run_dir / "checkpoints")


def compile_cache_dir(run_dir: pathlib.Path) -> pathlib.Path:
    """The compile cache travels with the job's checkpoints, so a restarted attempt on any host finds it."""
    cache = os.environ.get(ENV_COMPILE_CACHE_DIR)
    return pathlib.Path(cache) if cache else checkpoint_root(run_dir) / "compile-cache"


def persist_compiler_caches(cache_dir: pathlib.Path) -> None:
    """Keep Inductor's and Triton's on-disk caches (FX graphs, AOTAutograd entries, compiled kernels) in
    the job's compile-cache directory, beside the portable artifacts, so a restarted attempt starts from
    them too.  A directory already chosen in the environment is respected."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))


class Pending(NamedTuple):
    """A step queued on the device, not read yet: its loss and grad norm (pinned host memory on CUDA, filled behind
    the step) and the event recorded after it (None on CPU)."""

    step: int
    batch: int  # the data position, for the spike guard
    values: torch.Tensor
    event: torch.cuda.Event | None


def _scalar(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)  # FSDP2 returns the grad norm as a (replicated) DTensor
    return full() if callable(full) else t


class Trainer:
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

    # ---- set-up ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        spec, env, recipe = self.spec, self.env, self.recipe
        cap = memory.apply_memory_cap(self.device)
        torch.manual_seed(spec.seed)
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
        largest = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)

        def prediction(strategy: str) -> dict[str, Any]:
            return memory_model.predict(
                precision=self.prec.precision,
                strategy=strategy,
                world_size=env.world_size,
                largest_block_params=largest,
                grad_accum=self.cfg.grad_accum,
                **sizes,
            )

        capacity = device_capacity(self.device)
        if capacity is not None and cap is not None:
            capacity = int(capacity * cap)
        self.strategy = choose_strategy(
            spec.parallelism,
            predicted_ddp_bytes=prediction("ddp")["predicted_peak_bytes"],
            capacity=capacity,
            world_size=env.world_size,
        )
        self.prediction = prediction(self.strategy)
        self.cuda_graphs = cuda_graphs_on(spec, self.device, self.strategy)
        if spec.compile.cuda_graphs and not self.cuda_graphs:
            self.tel.event(
                "CUDA_GRAPHS_OFF",
                f"compile.cuda_graphs ignored ({self.device.type}, {self.strategy}): it needs a GPU and no sharding",
            )
        self.tel.emit(
            RecordKind.MEMORY_PREDICTION,
            **self.prediction,
            device_capacity_bytes=capacity,
            memory_fraction=cap,
            param_count=sizes["param_count"],
        )

        sharded = self.strategy == "fsdp" and env.distributed
        self.ckpt = Checkpointer(
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
            local_root=self._local_root(sharded),
            persist_every=spec.checkpointing.persist_every,
            lease=self.lease.ensure,
        )
        self.ckpt.verify_ahead()  # the newest checkpoints are hashed while the model compiles

        t3 = time.perf_counter()
        with user_code("building the data"):
            self.data = recipe.make_data(rank=env.rank, world_size=env.world_size, seed=spec.seed)
            first_batch = self.data.batch(0)
        if isinstance(recipe, UserRecipe):
            recipe.note_batch(first_batch)
        self.setup_s.update(build_s=t1 - t0, to_device_s=t2 - t1, data_s=time.perf_counter() - t3)
        self.tel.diagnostic(
            "SETUP_TIMES", "set-up before the compile", **{k: round(v, 3) for k, v in self.setup_s.items()}
        )
        self.phase = "compiling"
        warm_batch = recipe.batch_to(first_batch, self.device)
        compiler = Compiler(
            mode=self.compile_mode,
            timeout_s=spec.compile.timeout_s,
            max_rss_bytes=spec.compile.max_rss_bytes,
            check_allclose=spec.compile.check_allclose,
            cuda_graphs=self.cuda_graphs,
            hooks=self.cfg.hooks,
            telemetry=self.tel,
            device=self.device,
            model_name=recipe.name,
            cache_dir=self.cache_dir,
            rank=env.rank,
            world_size=env.world_size,
            group=env.ctrl,
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
        self.raw_model = model
        self.model = wrap(model, blocks, strategy=self.strategy, env=env, precision=self.prec)
        self.optimizer, self.fused = self._optimizer()
        self.guard = SpikeGuard(self.cfg.guard)
        self.flops = peak_flops(self.device, self.prec.precision, self.cfg.peak_flops)

    def _local_root(self, sharded: bool) -> pathlib.Path | None:
        """This job's directory in the host's local checkpoint tier, named by the worker (the same for every
        attempt of the job on this host, so a restart here finds what the last attempt left); None when the
        spec does not ask for the tier or the host has none."""
        if not self.spec.checkpointing.local_tier:
            return None
        local = os.environ.get(ENV_LOCAL_CHECKPOINT_DIR)
        if not local:
            self.tel.event("CHECKPOINT_LOCAL_TIER_OFF", "this host offers no local tier: durable checkpoints only")
            return None
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.env.world_size))
        if sharded and local_world != self.env.world_size:
            # DCP writes each rank's shards on its own host: a host-local tier would split one checkpoint
            # over several machines' local dirs, so sharded multi-host runs write to the durable dir only.
            self.tel.event(
                "CHECKPOINT_LOCAL_TIER_OFF",
                "sharded state over several hosts: no local tier",
                local_dir=local,
                world_size=self.env.world_size,
                local_world_size=local_world,
            )
            return None
        return pathlib.Path(local)

    def _optimizer(self) -> tuple[torch.optim.Optimizer, bool]:
        decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        kw: dict[str, Any] = {"lr": self.cfg.lr, "betas": (self.cfg.beta1, self.cfg.beta2)}
        try:
            # fused: one kernel per step, and it can skip a non-finite update on the device (found_inf)
            return torch.optim.AdamW(groups, fused=True, **kw), True
        except (RuntimeError, ValueError):
            return torch.optim.AdamW(groups, foreach=True, **kw), False

    def lr_at(self, step: int) -> float:
        c = self.cfg
        if c.warmup_steps and step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        span = max(1, self.spec.steps - c.warmup_steps)
        progress = min(1.0, (step - c.warmup_steps) / span)
        return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    # ---- state ----------------------------------------------------------------------------------------
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

    def _loop(self, flag: PreemptionFlag) -> ExitCode:
        spec, env, tel, cfg = self.spec, self.env, self.tel, self.cfg
        lag = LOSS_LAG_STEPS if self.device.type == "cuda" else 0
        pending: collections.deque[Pending] = collections.deque()
        # Where each queued step's loss and grad norm land on the host (pinned, so the copy is asynchronous): a
        # ring longer than the queue, so a slot is rewritten only after its step has been read.
        ring = torch.empty((lag + 2, 2), dtype=torch.float32, pin_memory=True) if lag else None
        self.last_event: torch.cuda.Event | None = None
        self.nonfinite_streak = 0  # steps in a row whose update was skipped
        poisoned = {b + i for b in cfg.hooks.loss_spike_at_step for i in range(cfg.hooks.loss_spike_len)}
        every_steps = spec.checkpointing.every_steps
        every_s = spec.checkpointing.every_seconds
        last_ckpt_t = time.monotonic()
        self.last_done_t = time.perf_counter()
        self.tokens_done = 0
        self.items_per_step = self.recipe.items_per_batch() * cfg.grad_accum * env.world_size
        self.flops_per_item = self.recipe.flops_per_item()
        self.t_start = time.perf_counter()
        self.phase = "training"
        params = [p for p in self.model.parameters() if p.requires_grad]
        staged = False
        self.overhead: str | None = "restore" if self.step else None  # kiln's own work since the last report
        while self.step < spec.steps:
            self.lease.ensure(f"step {self.step + 1}")  # one clock read while the lease is valid
            if self.step % GC_EVERY_STEPS == 0:
                gc.collect(1)
            self._note_overhead(self.ckpt.io_in_flight())
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # last step's graph outputs may be overwritten now
            loss_sum = torch.zeros((), device=self.device)
            index = -1
            for micro in range(cfg.grad_accum):
                index, batch = self.data.next()
                if index in poisoned:
                    batch = self.recipe.poison(batch)
                batch = self.recipe.batch_to(batch, self.device)
                with self._no_sync(micro < cfg.grad_accum - 1), self.prec.autocast():
                    loss = self.recipe.loss(self.model, batch) / cfg.grad_accum
                if index in cfg.hooks.nonfinite_at_step:
                    loss = loss * float("nan")
                self.prec.scale(loss).backward()
                loss_sum += loss.detach()
            for g in self.optimizer.param_groups:
                g["lr"] = self.lr_at(self.step)
            self.prec.unscale(self.optimizer)
            gn = _scalar(
                torch.nn.utils.clip_grad_norm_(
                    params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"), foreach=True
                )
            )
            self.ckpt.before_optimizer_step()
            if self.prec.scaler is None:
                if self.fused:
                    self.optimizer.found_inf = (~torch.isfinite(gn)).float()  # type: ignore[attr-defined]
                    self.optimizer.step()
                    self.optimizer.found_inf = None  # type: ignore[attr-defined]
                elif bool(torch.isfinite(gn)):
                    self.optimizer.step()
            else:
                self.prec.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            if env.distributed:
                dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
                loss_sum /= env.world_size
            self.step += 1
            if not staged:
                # Start-up, not a save: lay out and pin the checkpoint staging buffers once AdamW's state
                # exists (after the first step), so no save ever pays the ~1 s of pinning 1.5 GB.
                self.ckpt.prepare(self.model, self.optimizer)
                staged = True
            values = torch.stack((loss_sum.detach().float(), gn.detach().float()))
            event: torch.cuda.Event | None = None
            if ring is not None:
                values = ring[self.step % len(ring)].copy_(values, non_blocking=True)
                event = torch.cuda.Event(enable_timing=True)
                event.record()
            pending.append(Pending(self.step, index, values, event))
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
                if not stop:  # a preemption checkpoints at once; the next attempt evaluates
                    self._evaluate()
                self.phase = "checkpointing"
                if self.step == spec.steps and not stop:
                    self._save_final()
                else:
                    self.ckpt.save(self.step, self.model, self.optimizer, self.extra_state(), blocking=stop)
                self._note_overhead("save")  # the save's stall falls into the next reported step's time
                last_ckpt_t = time.monotonic()
                self.phase = "training"
                if stop:
                    tel.event(
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

    def _note_overhead(self, kind: str | None) -> None:
        """Remember the heaviest of kiln's own work seen since the last reported step (persist > save > write)."""
        rank = {None: 0, "write": 1, "save": 2, "restore": 3, "persist": 4}
        if rank.get(kind, 0) > rank.get(self.overhead, 0):
            self.overhead = kind

    def _no_sync(self, skip_sync: bool) -> contextlib.AbstractContextManager[Any]:
        if not skip_sync:
            return contextlib.nullcontext()
        no_sync = getattr(self.model, "no_sync", None)
        if callable(no_sync):
            return no_sync()
        return contextlib.nullcontext()

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


def run(spec: JobSpec, run_dir: pathlib.Path, env: DistEnv) -> ExitCode:
    """Train; whatever happens, the last telemetry record of this rank is an ``EXIT`` event naming the exit
    code (torchrun itself exits 1 when any rank fails, hiding 75/77/...; the worker reads this instead)."""
    tel = Telemetry(run_dir, env.rank)
    # Where a start's time goes (a restart is timed from the worker's launch to the first resumed step).
    started, launched = os.environ.get(ENV_RANK_STARTED_AT), os.environ.get(ENV_LAUNCHED_AT)
    tel.diagnostic(
        "STARTED",
        "trainer started",
        process_start_ts=float(started) if started else None,
        launched_ts=float(launched) if launched else None,
    )
    code: int = 1
    error: str | None = None
    try:
        code = _run(spec, run_dir, env, tel)
        return ExitCode(code)
    except UserError as exc:  # the job fails at once, with this line as its reason
        code, error = ExitCode.USER_ERROR, exc.line
        print(f"kiln trainer: {exc.line}", file=sys.stderr, flush=True)
        return ExitCode.USER_ERROR
    except TrainingDiverged as exc:  # not retried either: the same data and numerics diverge the same way
        code, error = ExitCode.TOO_MANY_SPIKES, str(exc)
        print(f"kiln trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.TOO_MANY_SPIKES
    except StorageUnwritable as exc:  # the host's storage, not the job: restarted from its last verified checkpoint
        code, error = ExitCode.STORAGE_ERROR, str(exc)[:2000]
        tel.event("CHECKPOINT_STORAGE_ERROR", error)
        print(f"kiln trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.STORAGE_ERROR
    except BaseException as exc:  # a crash: python exits 1 (re-raised below, after the record)
        code, error = 1, f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        try:
            reason = ExitCode(code).name
        except ValueError:
            reason = "CRASH"
        tel.event("EXIT", f"exiting with {code} ({reason})", exit_code=int(code), reason=reason, error=error)
        tel.close()


def _run(spec: JobSpec, run_dir: pathlib.Path, env: DistEnv, tel: Telemetry) -> ExitCode:
    try:
        trainer = Trainer(spec, run_dir, env, tel)
        return trainer.train()
    except LeaseExpired as exc:
        tel.event("LEASE_EXPIRED_EXIT", str(exc))
        return ExitCode.LEASE_EXPIRED
    except FencedError as exc:
        tel.event("FENCED", str(exc))
        return ExitCode.FENCED
    except torch.OutOfMemoryError as exc:
        tel.event("OOM", f"out of memory: {exc}"[:2000])
        return ExitCode.OOM
    except RuntimeError as exc:  # DistBackendError is one
        if not is_collective_failure(exc):
            raise
        tel.event("NCCL_ERROR", f"collective failed: {exc}"[:2000])
        return ExitCode.NCCL_ERROR


def _hang_forever() -> None:
    """The ``hang_at_step`` test hook: a loop stuck as in a collective that never returns. The heartbeat thread
    ticks on and the SIGTERM handler only sets a flag nobody reads; only SIGKILL ends it."""
    while True:
        time.sleep(3600)
