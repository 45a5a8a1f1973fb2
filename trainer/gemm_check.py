"""Are this process's low-precision GEMMs right? A check run once, before the model is built.

On the H200 host, a process that is an MPS client with an SM cap below 100% (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
30 and 60 alike; torch 2.11, CUDA 13.0, driver 580) gets non-finite values from bf16 and fp16 GEMMs with a long
reduction and a small output, a weight gradient's shape (tokens x features, transposed, times tokens x features):
a few hundred NaNs in each of GPT-2's 768x2304, 768x768, 768x3072 and 3072x768 weight gradients, eager and compiled,
whatever the cuBLAS workspace, reduced-precision reduction or BLAS library (``bench/sm_cap_probe.py --blas``,
``bench/results/sm_cap_probe_blas.json``). The same process at 100%, and fp32 GEMMs under the cap, are right. So
the trainer does not assume its precision works where it runs: it multiplies such shapes in the precision it was
given, compares them with fp32, and falls back to the first precision whose GEMMs are right (fp32 with TF32
tensor cores, then plain fp32), saying so in an event. It costs a few milliseconds.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import torch

from trainer.precision import Precision
from trainer.telemetry import Telemetry

# (rows, columns, reduction): weight gradients of a 768-wide transformer over a batch of 32 x 1024 tokens. The
# long reduction over a small output is what a BLAS library splits across SMs.
SHAPES = ((768, 768, 32768), (768, 3072, 32768))
# Relative (Frobenius) error of a right bf16 product of such shapes is about 0.003; a broken one is NaN.
MAX_RELATIVE_ERROR = 0.05


@dataclasses.dataclass(frozen=True)
class GemmCheck:
    ok: bool
    detail: str  # the first wrong shape and how it was wrong, or the largest error seen


def check_gemms(
    device: torch.device, dtype: torch.dtype, *, tf32: bool = False, shapes: Sequence[tuple[int, int, int]] = SHAPES
) -> GemmCheck:
    """Products of ``shapes`` in ``dtype`` (fp32 with ``tf32`` tensor cores when asked) against plain fp32."""
    gen = torch.Generator(device=device).manual_seed(0)
    worst = 0.0
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    try:
        for rows, cols, k in shapes:
            a = torch.randn(k, rows, device=device, generator=gen)
            b = torch.randn(k, cols, device=device, generator=gen) * 0.01
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = a.t() @ b
            torch.backends.cuda.matmul.allow_tf32 = tf32
            got = (a.to(dtype).t() @ b.to(dtype)).float()
            bad = int((~torch.isfinite(got)).sum())
            shape = f"{rows}x{k} @ {k}x{cols}"
            if bad:
                return GemmCheck(False, f"{bad} non-finite values in a {shape} product")
            err = float((got - ref).norm() / ref.norm())
            if err > MAX_RELATIVE_ERROR:
                return GemmCheck(False, f"relative error {err:.3g} in a {shape} product")
            worst = max(worst, err)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return GemmCheck(True, f"largest relative error {worst:.2g}")


def usable_precision(
    requested: Precision, device: torch.device, tel: Telemetry, check: Callable[..., GemmCheck] = check_gemms
) -> tuple[Precision, bool]:
    """``requested`` where its GEMMs are right here, else the first fallback that is: (precision, TF32 on)."""
    if device.type != "cuda" or requested == "fp32":
        return requested, False
    first = check(device, {"bf16": torch.bfloat16, "fp16": torch.float16}[requested])
    torch.cuda.empty_cache()  # the check's operands (about 1 GB) go back before the job's memory cap is set
    if first.ok:
        return requested, False
    cap = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    where = f" (an MPS client capped at {cap}% of the SMs)" if cap else ""
    tf32 = check(device, torch.float32, tf32=True)
    torch.cuda.empty_cache()
    # Plain fp32 is the reference itself: the last resort needs no check.
    fallback = "fp32 with TF32 matmuls" if tf32.ok else "fp32"
    tel.event(
        "PRECISION_FALLBACK",
        f"{requested} GEMMs are wrong on this GPU{where}: {first.detail}; training in {fallback} instead",
        requested=requested,
        fallback=fallback,
        tf32_check=tf32.detail,
        sm_percent=int(cap) if cap and cap.isdigit() else None,
    )
    return "fp32", tf32.ok
