"""How many CPU threads a rank of a GPU attempt gets (its ``OMP_NUM_THREADS``, set by ``workers.attempt_env``).

A module of its own, with nothing imported, so that the GPU sharing bench (``bench/mps_bench.py``, standard library
only) measures the very rule the worker applies.
"""

from __future__ import annotations


def cpu_threads_per_rank(*, cores: int, host_gpus: int, gpu_fraction: float) -> int:
    """OpenMP threads for one rank of a GPU attempt: the part of the host's cores that goes with its part of the
    host's GPUs (a share holds its memory's fraction of one GPU).  Left to itself every rank starts a thread per
    core: four shares of one H200 (16 cores) trained at 30 steps/s each, at 118 with 4 threads each, their
    threads no longer spinning against each other (a check by hand; ``bench/mps_bench.py --phases threads``
    repeats it). For those 16 GiB shares this rule gives 2 each, and through kiln the four then trained each as
    fast as one alone (bench/results/mps_bench_run12.json)."""
    return max(1, round(cores / max(1, host_gpus) * gpu_fraction))
