"""GPU types: one vocabulary for hosts, specs, quotas, prices, the dashboard and ``/metrics``.

NVML names a GPU by its marketing name (``NVIDIA H200``, ``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-40GB``);
people write ``H200`` or ``h100-80gb``. kiln keeps one short type per GPU model, made from either form by
``canonical``: the vendor prefix and the words that do not change what a job can use (the SXM form factor, the
memory technology) are dropped, the memory size and the PCIe/NVL variants are kept, because a job may fit one
and not the other:

    NVIDIA H200               -> H200          NVIDIA H100 80GB HBM3   -> H100-80GB
    NVIDIA H100 PCIe          -> H100-PCIE     NVIDIA A100-SXM4-40GB   -> A100-40GB
    NVIDIA A100 80GB PCIe     -> A100-80GB-PCIE Tesla V100-SXM2-32GB   -> V100-32GB

The host's GPU row keeps NVML's name beside the type. ``canonical`` is idempotent, so a type written by a person
and a type made from NVML's name compare equal.

A job may ask for a whole family: a type that is a model alone (``H100``, ``A100``, ``H200``) matches that model
with any memory size or form (``H100-80GB``, ``H100-PCIE``, ``H100``), since whoever writes no variant accepts any;
a type that names a variant (``H100-80GB``) matches that variant only (``matches``). All a job's GPUs are still of
one type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

ANY = "*"  # a quota or price that covers every GPU type
CPU = "cpu"  # the "type" of CPU slots (jobs with gpus == 0)
TYPE_PATTERN = r"^[A-Z0-9][A-Z0-9.-]{0,47}$"

_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
_DROPPED = frozenset({"SXM", "SXM2", "SXM3", "SXM4", "SXM5", "SXM6", "HBM", "HBM2", "HBM2E", "HBM3", "HBM3E", "GPU"})
_FORM = frozenset({"PCIE", "NVL", "MIG"})
_MEMORY = re.compile(r"^\d+(GB|G|TB)$")


class GpuTypeError(ValueError):
    """A name that cannot be a GPU type (empty, or characters outside letters, digits, '.', '-')."""


def canonical(name: str) -> str:
    """The GPU type of an NVML name or of a type a person wrote. Raises GpuTypeError when nothing is left."""
    words = [w for w in re.split(r"[^A-Z0-9.]+", name.strip().upper()) if w]
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    kept = [w for w in words if w not in _DROPPED]
    model = [w for w in kept if not _MEMORY.match(w) and w not in _FORM]
    memory = [w + "B" if w.endswith("G") else w for w in kept if _MEMORY.match(w)]
    form = [w for w in kept if w in _FORM]
    result = "-".join(model + memory + form)
    if not result or not re.match(TYPE_PATTERN, result):
        raise GpuTypeError(f"{name!r} is not a GPU type (letters, digits, '.' and '-', such as 'H200')")
    return result


# What ``canonical`` appends to a model: a memory size, then the PCIe/NVL/MIG form.
_VARIANT = r"-(?:\d+(?:GB|TB)|PCIE|NVL|MIG)"


@lru_cache(maxsize=256)  # the scheduler asks for every GPU type it meets, each cycle
def family(gpu_type: str) -> str:
    """The model a canonical type is a variant of: ``H100-80GB-PCIE`` -> ``H100``, ``H200`` -> ``H200``."""
    return re.sub(f"(?:{_VARIANT})+$", "", gpu_type)


def variants_pattern(asked: str) -> str | None:
    """A regular expression for the types a family name matches besides itself (for SQL); None for a variant."""
    if family(asked) != asked:
        return None
    return f"^{re.escape(asked)}(?:{_VARIANT})+$"


def matches(asked: str, gpu_type: str) -> bool:
    """Whether a job asking for ``asked`` may run on GPUs of ``gpu_type`` (both canonical): the same type, or a
    variant of the family ``asked`` names."""
    return asked == gpu_type or (family(asked) == asked and family(gpu_type) == asked)


def canonical_key(name: str) -> str:
    """A quota or price key: ``*`` and ``cpu`` as they are, any other name as its GPU type."""
    stripped = name.strip()
    if stripped == ANY or stripped.lower() == CPU:
        return stripped.lower()
    return canonical(stripped)


# Clients one GPU's MPS server takes (48 on Volta and newer; kept lower so that each share stays worth having):
# the scheduler puts at most this many fractional jobs on one GPU, and a worker runs at most this many per GPU.
MPS_MAX_CLIENTS_PER_GPU = 16


@dataclass(frozen=True)
class PeakFigures:
    """A GPU type's published peaks: dense tensor-core bf16 (fp16 is the same), fp32 without tensor cores, and the
    memory's bandwidth. What a step could reach, not what it does: ``core.estimate`` uses their ratios only."""

    bf16_tflops: float
    fp32_tflops: float
    bandwidth_gbs: float

    def tflops(self, precision: str) -> float:
        """The peak a step in ``precision`` is bound by: bf16/fp16 on the tensor cores, fp32 on the CUDA cores (the
        trainer leaves TF32 off for fp32 unless it falls back from a share's refused GEMMs)."""
        return self.fp32_tflops if precision == "fp32" else self.bf16_tflops


# NVIDIA's datasheets, dense figures (the sheets' bf16 headline is with 2:4 sparsity, twice these). Only the types
# whose figures are certain; a PCIe or NVL variant has its own (lower clocks, other memory) and is not listed, so
# no step time is carried to or from it.
PEAKS: dict[str, PeakFigures] = {
    # "NVIDIA H100 Tensor Core GPU" datasheet, H100 SXM: 989 TF bf16, 67 TF fp32, 3.35 TB/s HBM3
    "H100-80GB": PeakFigures(989.0, 67.0, 3350.0),
    # "NVIDIA H200 Tensor Core GPU" datasheet, H200 SXM: 989 TF bf16, 67 TF fp32, 4.8 TB/s HBM3e
    "H200": PeakFigures(989.0, 67.0, 4800.0),
    # "NVIDIA A100 Tensor Core GPU" datasheet, A100 80GB SXM: 312 TF bf16, 19.5 TF fp32, 2,039 GB/s HBM2e
    "A100-80GB": PeakFigures(312.0, 19.5, 2039.0),
    # the same datasheet, A100 40GB SXM: 312 TF bf16, 19.5 TF fp32, 1,555 GB/s HBM2
    "A100-40GB": PeakFigures(312.0, 19.5, 1555.0),
    # "NVIDIA L40S GPU" datasheet: 362.05 TF bf16, 91.6 TF fp32, 864 GB/s GDDR6
    "L40S": PeakFigures(362.05, 91.6, 864.0),
}


def peak_figures(gpu_type: str) -> PeakFigures | None:
    """The published peaks of a canonical GPU type; None for one not in ``PEAKS`` (and the CPU)."""
    return PEAKS.get(gpu_type)
