"""The trainer's check of its own low-precision GEMMs (trainer/gemm_check.py).

A GPU whose bf16 GEMMs come out wrong (the H200 under an MPS SM cap) is a boundary this machine lacks: the
fallback's decisions are tested with a check that reports what that GPU reported; the check itself runs for real
on the CPU.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from core.telemetry import Telemetry
from trainer.gemm_check import GemmCheck, PrecisionChoice, check_gemms, check_triton_gemms, usable_precision

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


def test_the_check_passes_right_products_and_names_the_error() -> None:
    result = check_gemms(torch.device("cpu"), torch.bfloat16, shapes=[(64, 96, 4096)])
    assert result.ok and result.detail.startswith("largest relative error")


def h200_under_a_cap(tf32_ok: bool) -> tuple[list[tuple[torch.dtype, bool]], Callable[..., GemmCheck]]:
    """What the H200 under a 30% MPS cap reported (bench/results/sm_cap_probe_blas.json): NaNs in bf16/fp16."""
    calls: list[tuple[torch.dtype, bool]] = []

    def check(device: torch.device, dtype: torch.dtype, *, tf32: bool = False) -> GemmCheck:
        calls.append((dtype, tf32))
        if dtype in (torch.bfloat16, torch.float16):
            return GemmCheck(False, "127 non-finite values in a 768x32768 @ 32768x768 product")
        return GemmCheck(tf32_ok, "largest relative error 0.0004" if tf32_ok else "3 non-finite values")

    return calls, check


def events(run_dir: pathlib.Path) -> list[dict]:
    lines = (run_dir / "telemetry" / "rank0.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "event"]


@pytest.mark.parametrize(("tf32_ok", "fallback"), [(True, "fp32 with TF32 matmuls"), (False, "fp32")])
def test_wrong_bf16_gemms_fall_back_to_the_first_precision_that_is_right_and_say_so(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tf32_ok: bool, fallback: str
) -> None:
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")
    calls, check = h200_under_a_cap(tf32_ok)
    tel = Telemetry(tmp_path, 0)
    assert usable_precision("bf16", CUDA, tel, compiled=False, check=check) == PrecisionChoice("fp32", tf32=tf32_ok)
    assert calls == [(torch.bfloat16, False), (torch.float32, True)]
    [event] = events(tmp_path)
    assert event["type"] == "PRECISION_FALLBACK"
    assert event["message"] == (
        "bf16 GEMMs are wrong on this GPU (an MPS client capped at 30% of the SMs): 127 non-finite values in a "
        f"768x32768 @ 32768x768 product; training in {fallback} instead"
    )
    assert event["fields"]["sm_percent"] == 30 and event["fields"]["fallback"] == fallback


def test_right_gemms_keep_the_precision_and_fp32_or_a_cpu_is_not_checked(tmp_path: pathlib.Path) -> None:
    tel = Telemetry(tmp_path, 0)
    calls: list[torch.dtype] = []

    def right(device: torch.device, dtype: torch.dtype, *, tf32: bool = False) -> GemmCheck:
        calls.append(dtype)
        return GemmCheck(True, "largest relative error 0.003")

    assert usable_precision("bf16", CUDA, tel, compiled=True, check=right) == PrecisionChoice("bf16")
    assert usable_precision("fp16", CUDA, tel, compiled=True, check=right) == PrecisionChoice("fp16")
    assert usable_precision("fp32", CUDA, tel, compiled=True, check=right) == PrecisionChoice("fp32")
    assert usable_precision("bf16", torch.device("cpu"), tel, compiled=True, check=right) == PrecisionChoice("bf16")
    assert calls == [torch.bfloat16, torch.float16]
    assert events(tmp_path) == []


def triton(ok: bool, calls: list[str]) -> Callable[..., GemmCheck]:
    """What Triton's GEMMs reported under the cap (an outside probe on an H100 at 30%: right, error 0.3-0.5%)."""

    def check(device: torch.device, dtype: torch.dtype) -> GemmCheck:
        calls.append(str(dtype))
        return GemmCheck(ok, "largest relative error 0.0041" if ok else "12 non-finite values in a 768x32768 product")

    return check


@pytest.fixture
def inductor_settings_restored() -> Iterator[Any]:
    import torch._inductor.config as inductor_config

    saved = inductor_config.save_config()
    yield inductor_config
    inductor_config.load_config(saved)


def test_a_compiled_job_keeps_bf16_through_triton_gemms_where_only_cublas_is_wrong(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, inductor_settings_restored: Any
) -> None:
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")
    cublas_calls, cublas = h200_under_a_cap(tf32_ok=True)
    triton_calls: list[str] = []
    tel = Telemetry(tmp_path, 0)
    choice = usable_precision("bf16", CUDA, tel, compiled=True, check=cublas, triton_check=triton(True, triton_calls))
    assert choice == PrecisionChoice("bf16", triton_gemms=True)
    assert cublas_calls == [(torch.bfloat16, False)] and triton_calls == ["torch.bfloat16"]
    config = inductor_settings_restored
    assert config.max_autotune_gemm and config.max_autotune_gemm_backends == "TRITON"
    [event] = events(tmp_path)
    assert event["type"] == "PRECISION_TRITON_GEMMS"
    assert event["message"] == (
        "bf16 GEMMs from cuBLAS are wrong on this GPU (an MPS client capped at 30% of the SMs): 127 non-finite values "
        "in a 768x32768 @ 32768x768 product; the compiled model's GEMMs go through Triton, which are right (largest "
        "relative error 0.0041)"
    )


@pytest.mark.parametrize("compiled", [False, True])
def test_an_eager_job_or_wrong_triton_gemms_fall_back_to_fp32(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, inductor_settings_restored: Any, compiled: bool
) -> None:
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")
    _, cublas = h200_under_a_cap(tf32_ok=True)
    triton_calls: list[str] = []
    tel = Telemetry(tmp_path, 0)
    choice = usable_precision(
        "bf16", CUDA, tel, compiled=compiled, check=cublas, triton_check=triton(False, triton_calls)
    )
    assert choice == PrecisionChoice("fp32", tf32=True)
    assert triton_calls == (["torch.bfloat16"] if compiled else [])  # an eager job's GEMMs would be cuBLAS's
    assert not inductor_settings_restored.max_autotune_gemm
    [event] = events(tmp_path)
    assert event["type"] == "PRECISION_FALLBACK"
    assert ("Triton's too: 12 non-finite values" in event["message"]) is compiled


def test_the_triton_check_says_why_where_no_triton_gemm_can_be_compiled(inductor_settings_restored: Any) -> None:
    """On this CPU there is no Triton: Inductor finds no template for the product and, with no fallback to ATen,
    the compile fails; the check reports it rather than raising, and leaves the process's settings as they were."""
    result = check_triton_gemms(torch.device("cpu"), torch.bfloat16, shapes=[(64, 96, 512)])
    assert not result.ok and result.detail.startswith("Triton GEMMs could not be compiled:")
    assert not inductor_settings_restored.max_autotune_gemm
