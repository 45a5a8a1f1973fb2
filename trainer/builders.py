"""A run's builders, apart from the step and the loop: the compile mode and its caches, the optimizer, the local
checkpoint tier, the compiler; each a function of the spec and the environment."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import torch
from torch import nn

from core import memory as memory_model
from core.spec import JobSpec
from core.telemetry import Telemetry
from core.trainer_protocol import ENV_CHECKPOINT_DIR, ENV_COMPILE_CACHE_DIR, ENV_LOCAL_CHECKPOINT_DIR, RecordKind
from trainer.compile import Compiler
from trainer.config import TrainerConfig
from trainer.parallel import DistEnv, choose_strategy, device_capacity

# Dense bf16/fp16 tensor-core peaks (vendor datasheets) for the MFU estimate; override with peak_flops.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}

# Tolerances of the compiled-vs-eager first-step loss check, per precision.
ALLCLOSE = {"fp32": (1e-4, 1e-5), "bf16": (2e-2, 1e-3), "fp16": (1e-2, 1e-3)}


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
    # Cached kernels keep their GPU binaries (trainer.compile.portable_kernels), unless the environment says not to:
    # Inductor reads the variable as its config loads, so a config loaded already (a bare run that compiled its
    # precision check first) is told directly.
    keep = os.environ.setdefault("TORCHINDUCTOR_KEEP_STATIC_CUBIN_RAW", "1") == "1"
    inductor_config = sys.modules.get("torch._inductor.config")
    if keep and inductor_config is not None and hasattr(inductor_config, "keep_static_cubin_raw"):
        setattr(inductor_config, "keep_static_cubin_raw", True)  # noqa: B010 - a module found at run time


def build_optimizer(model: nn.Module, cfg: TrainerConfig) -> tuple[torch.optim.Optimizer, bool]:
    """AdamW, weight decay on the matrices only; True with it when fused (the update can be skipped on the device)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw: dict[str, Any] = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2)}
    try:
        # fused: one kernel per step, and it can skip a non-finite update on the device (found_inf)
        return torch.optim.AdamW(groups, fused=True, **kw), True
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw), False


def local_tier_root(spec: JobSpec, env: DistEnv, tel: Telemetry, sharded: bool) -> pathlib.Path | None:
    """This job's directory in the host's local checkpoint tier, named by the worker (the same for every
    attempt of the job on this host, so a restart here finds what the last attempt left); None when the
    spec does not ask for the tier or the host has none."""
    if not spec.checkpointing.local_tier:
        return None
    local = os.environ.get(ENV_LOCAL_CHECKPOINT_DIR)
    if not local:
        tel.event("CHECKPOINT_LOCAL_TIER_OFF", "this host offers no local tier: durable checkpoints only")
        return None
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    if sharded and local_world != env.world_size:
        # DCP writes each rank's shards on its own host: a host-local tier would split one checkpoint
        # over several machines' local dirs, so sharded multi-host runs write to the durable dir only.
        tel.event(
            "CHECKPOINT_LOCAL_TIER_OFF",
            "sharded state over several hosts: no local tier",
            local_dir=local,
            world_size=env.world_size,
            local_world_size=local_world,
        )
        return None
    return pathlib.Path(local)


def plan_memory(
    spec: JobSpec,
    env: DistEnv,
    tel: Telemetry,
    *,
    precision: str,
    grad_accum: int,
    sizes: dict[str, int],
    largest: int,
    cap: float | None,
) -> tuple[str, dict[str, Any], bool]:
    """The parallel strategy for the predicted peak memory, its prediction, and whether CUDA graphs can be used
    with it; the MEMORY_PREDICTION record."""
    device = env.device

    def prediction(strategy: str) -> dict[str, Any]:
        return memory_model.predict(
            precision=precision,
            strategy=strategy,
            world_size=env.world_size,
            largest_block_params=largest,
            grad_accum=grad_accum,
            **sizes,
        )

    capacity = device_capacity(device)
    if capacity is not None and cap is not None:
        capacity = int(capacity * cap)
    strategy = choose_strategy(
        spec.parallelism,
        predicted_ddp_bytes=prediction("ddp")["predicted_peak_bytes"],
        capacity=capacity,
        world_size=env.world_size,
    )
    predicted = prediction(strategy)
    cuda_graphs = cuda_graphs_on(spec, device, strategy)
    if spec.compile.cuda_graphs and not cuda_graphs:
        tel.event(
            "CUDA_GRAPHS_OFF",
            f"compile.cuda_graphs ignored ({device.type}, {strategy}): it needs a GPU and no sharding",
        )
    tel.emit(
        RecordKind.MEMORY_PREDICTION,
        **predicted,
        device_capacity_bytes=capacity,
        memory_fraction=cap,
        param_count=sizes["param_count"],
    )
    return strategy, predicted, cuda_graphs


def build_compiler(
    spec: JobSpec,
    cfg: TrainerConfig,
    env: DistEnv,
    tel: Telemetry,
    *,
    mode: str,
    cuda_graphs: bool,
    model_name: str,
    cache_dir: pathlib.Path,
    strategy: str,
    triton_gemms: bool,
) -> Compiler:
    """The compile behind its circuit breaker, as the spec asks for it."""
    return Compiler(
        mode=mode,
        timeout_s=spec.compile.timeout_s,
        max_rss_bytes=spec.compile.max_rss_bytes,
        check_allclose=spec.compile.check_allclose,
        cuda_graphs=cuda_graphs,
        hooks=cfg.hooks,
        telemetry=tel,
        device=env.device,
        model_name=model_name,
        cache_dir=cache_dir,
        rank=env.rank,
        world_size=env.world_size,
        group=env.ctrl,
        strategy=strategy,
        triton_gemms=triton_gemms,
    )
