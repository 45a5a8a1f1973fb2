"""``deterministic: true``: the same spec, seed and hardware give the same loss at every step, bit for bit.

GPU training is not reproducible by default: cuBLAS may split a reduction across streams, some backward kernels add
with atomics, and the compiler picks kernels by timing them on the device (two H200 runs of the same gold job
differed in the fourth decimal of the loss: bench/results/mps_bench_run6.json). Turned on before the first GEMM,
since cuBLAS reads its workspace setting when it creates its handle.
"""

from __future__ import annotations

import os

import torch

from trainer import compile_preload


def enable_determinism() -> str:
    """Deterministic kernels for the rest of this process; returns what was set, for the job's timeline."""
    # torch.use_deterministic_algorithms imports Inductor's config, and with it Dynamo: with the background
    # import of the compiler (compile_preload) half way through the same modules, the two threads' imports
    # deadlock (Python raises _DeadlockError or a circular ImportError; H200 run 8). Let it finish first.
    compile_preload.wait()
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS's documented setting for reproducible results
    torch.use_deterministic_algorithms(True)  # an op without a deterministic kernel raises instead of drifting
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    import torch._inductor.config as inductor

    if hasattr(inductor, "deterministic"):  # torch >= 2.8
        inductor.deterministic = True  # no on-device benchmarking to choose kernels
    return "deterministic kernels: torch deterministic algorithms, cuBLAS workspace :4096:8, no compiler autotuning"
