"""Are this process's low-precision GEMMs right? A check run once, before the model is built.

On the H200 host, a process that is an MPS client with an SM cap below 100% (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
30 and 60 alike; torch 2.11, CUDA 13.0, driver 580) gets non-finite values from bf16 and fp16 GEMMs with a long
reduction and a small output, a weight gradient's shape (tokens x features, transposed, times tokens x features):
a few hundred NaNs in each of GPT-2's 768x2304, 768x768, 768x3072 and 3072x768 weight gradients, eager and compiled,
whatever the cuBLAS workspace, reduced-precision reduction or BLAS library (``bench/sm_cap_probe.py --blas``,
``bench/results/sm_cap_probe_blas.json``). The same process at 100%, and fp32 GEMMs under the cap, are right; so
are Triton's GEMMs (Inductor's templates) under the cap, an outside probe on an H100 at 30% found. So the trainer
does not assume its precision works where it runs: it multiplies such shapes in the precision it was given and
compares them with fp32. Where cuBLAS is wrong and the model is compiled, the same products compiled by Inductor
with Triton GEMM templates only are checked next: if they are right, the compiled model's GEMMs all go through
Triton (autotuned once per team and key: the compile cache keeps the choice) and the job keeps its precision.
Otherwise it falls back to the first precision whose GEMMs are right (fp32 with TF32 tensor cores, then plain
fp32), saying so in an event. The cuBLAS check costs a few milliseconds, the Triton one a compile.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from core.telemetry import Telemetry
from trainer.precision import Precision

# (rows, columns, reduction): weight gradients of a 768-wide transformer over a batch of 32 x 1024 tokens. The
# long reduction over a small output is what a BLAS library splits across SMs.
SHAPES = ((768, 768, 32768), (768, 3072, 32768))
# Relative (Frobenius) error of a right bf16 product of such shapes is about 0.003; a broken one is NaN.
MAX_RELATIVE_ERROR = 0.05
# Inductor's settings that put every compiled GEMM on its Triton templates, autotuned; none on cuBLAS (ATen), and
# none falls back to it (``autotune_fallback_to_aten`` is off in torch 2.13: a GEMM no template fits fails the
# compile, and a failed compile falls back to fp32, below).
TRITON_GEMMS: dict[str, Any] = {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON"}

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _transposed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.t() @ b


@dataclasses.dataclass(frozen=True)
class GemmCheck:
    ok: bool
    detail: str  # the first wrong shape and how it was wrong, or the largest error seen


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """The precision a job trains in here, and how its GEMMs are computed."""

    precision: Precision
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores
    triton_gemms: bool = False  # the compiled model's GEMMs through Triton only (its eager ones would be wrong)


def check_gemms(
    device: torch.device,
    dtype: torch.dtype,
    *,
    tf32: bool = False,
    shapes: Sequence[tuple[int, int, int]] = SHAPES,
    product: Product = _transposed_product,
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
            got = product(a.to(dtype), b.to(dtype)).float()
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


def check_triton_gemms(
    device: torch.device, dtype: torch.dtype, *, shapes: Sequence[tuple[int, int, int]] = SHAPES
) -> GemmCheck:
    """The same products compiled by Inductor with Triton GEMM templates only, as the model's would be."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(TRITON_GEMMS):
        product = torch.compile(_transposed_product, fullgraph=True, dynamic=False)
        try:
            return check_gemms(device, dtype, shapes=shapes, product=product)
        except Exception as exc:  # no template fits, no Triton here (a CPU): cuBLAS is all there is
            return GemmCheck(False, f"Triton GEMMs could not be compiled: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            torch._dynamo.reset()  # the check's graphs are not the model's: nothing of them stays in Dynamo


def use_triton_gemms() -> None:
    """Every GEMM this process compiles from now on goes through Triton (process-wide: it trains one model)."""
    import torch._inductor.config as inductor_config

    for name, value in TRITON_GEMMS.items():
        setattr(inductor_config, name, value)


def _sm_percent() -> int | None:
    cap = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
    return int(cap) if cap.isdigit() else None


def _where() -> str:
    cap = _sm_percent()
    return f" (an MPS client capped at {cap}% of the SMs)" if cap is not None else ""


def usable_precision(
    requested: Precision,
    device: torch.device,
    tel: Telemetry,
    *,
    compiled: bool,
    check: Callable[..., GemmCheck] = check_gemms,
    triton_check: Callable[..., GemmCheck] = check_triton_gemms,
) -> PrecisionChoice:
    """``requested`` where its GEMMs are right here (through Triton if only those are, and the model is
    ``compiled``), else the first fallback that is."""
    if device.type != "cuda" or requested == "fp32":
        return PrecisionChoice(requested)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[requested]
    first = check(device, dtype)
    torch.cuda.empty_cache()  # the check's operands (about 1 GB) go back before the job's memory cap is set
    if first.ok:
        return PrecisionChoice(requested)
    why = f"{requested} GEMMs are wrong on this GPU{_where()}: {first.detail}"
    if not compiled:
        return fall_back(requested, device, tel, why, check=check)
    triton = triton_check(device, dtype)
    torch.cuda.empty_cache()
    if not triton.ok:
        return fall_back(requested, device, tel, f"{why}; Triton's too: {triton.detail}", check=check)
    use_triton_gemms()
    tel.event(
        "PRECISION_TRITON_GEMMS",
        f"{requested} GEMMs from cuBLAS are wrong on this GPU{_where()}: {first.detail}; the compiled model's GEMMs "
        f"go through Triton, which are right ({triton.detail})",
        precision=requested,
        cublas_check=first.detail,
        triton_check=triton.detail,
        sm_percent=_sm_percent(),
    )
    return PrecisionChoice(requested, triton_gemms=True)


def fall_back(
    requested: Precision, device: torch.device, tel: Telemetry, why: str, *, check: Callable[..., GemmCheck]
) -> PrecisionChoice:
    """fp32, on TF32 tensor cores where those are right here: ``PRECISION_FALLBACK`` says why."""
    tf32 = check(device, torch.float32, tf32=True)
    torch.cuda.empty_cache()
    # Plain fp32 is the reference itself: the last resort needs no check.
    fallback = "fp32 with TF32 matmuls" if tf32.ok else "fp32"
    tel.event(
        "PRECISION_FALLBACK",
        f"{why}; training in {fallback} instead",
        requested=requested,
        fallback=fallback,
        tf32_check=tf32.detail,
        sm_percent=_sm_percent(),
    )
    return PrecisionChoice("fp32", tf32=tf32.ok)
