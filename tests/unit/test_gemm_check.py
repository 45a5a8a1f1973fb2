"""The trainer's check of its own low-precision GEMMs (trainer/gemm_check.py).

A GPU whose bf16 GEMMs come out wrong (the H200 under an MPS SM cap) is a boundary this machine lacks: the
fallback's decisions are tested with a check that reports what that GPU reported; the check itself runs for real
on the CPU.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from trainer.gemm_check import GemmCheck, check_gemms, usable_precision
from trainer.telemetry import Telemetry

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


def test_the_check_passes_right_products_and_names_the_error() -> None:
    result = check_gemms(torch.device("cpu"), torch.bfloat16, shapes=[(64, 96, 4096)])
    assert result.ok and result.detail.startswith("largest relative error")


def h200_under_a_cap(tf32_ok: bool) -> tuple[list[tuple[torch.dtype, bool]], object]:
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
    assert usable_precision("bf16", CUDA, tel, check=check) == ("fp32", tf32_ok)
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

    assert usable_precision("bf16", CUDA, tel, check=right) == ("bf16", False)
    assert usable_precision("fp16", CUDA, tel, check=right) == ("fp16", False)
    assert usable_precision("fp32", CUDA, tel, check=right) == ("fp32", False)
    assert usable_precision("bf16", torch.device("cpu"), tel, check=right) == ("bf16", False)
    assert calls == [torch.bfloat16, torch.float16]
    assert events(tmp_path) == []
