"""What a job will cost, run by run, before it runs: the arithmetic of ``kiln estimate`` (pure, torch-free).

A job's step time is read from kiln's own measurements (``Run``: one finished attempt's steady steps), in this
order of trust:

* **measured**: attempts of the same recipe and shape (model, per-rank batch, gradient accumulation) in the very
  same configuration (GPU type, GPUs, parallelism, compile, precision, whole GPU or a share); the median of their
  steps, with the 10th and 90th percentiles as its spread;
* **scaled**: another shape of the recipe on the same GPU type, compile and precision, its step time scaled by the
  FLOPs a rank does per step (the nearest such shape, preferring the same number of GPUs and parallelism). The
  model's FLOPs say nothing of launch overheads or communication, so a scaled figure is labelled as such;
* **cross-type** (``scaled from <type>``): no run of the recipe on this GPU type, but runs on another type with
  published peak figures (``core.gpu_types.PEAKS``): the nearest such run (same compile, precision and share;
  the same layout and shape preferred), its shape scaled by FLOPs as above, then by the two types' peaks. The part
  of its step the matmuls take at a reachable share of the peak (``MATMUL_EFFICIENCY``) scales by the peak
  throughputs' ratio, the rest by the memory bandwidths'; its spread runs from the one bound to the other (a step
  all bandwidth-bound to one all compute-bound), wider than a measurement's;
* **none**: nothing measured to go by, said plainly (no figure is made up).

The total is the attempt's start-up (launch to first step, compile included: what the usage account charges too)
plus ``steps`` x the step time; GPU-hours count every GPU of the job (a GPU share is charged as a whole GPU, as
``core.lifecycle`` accounts it); cost is GPU-hours x the GPU type's price. The recommendation is the cheapest option
that fits memory and, where the spec has a deadline, finishes before it (the run alone here:
``core.services.estimates`` adds the expected start), measured options before scaled ones, scaled before cross-type;
the job as written stands unless another option is cheaper at its slow end too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from core.gpu_types import peak_figures

SINGLE = "single"  # one process trains the bare module: neither DDP nor FSDP
# The share of a GPU's peak its matmuls reach in a training step (large bf16 GEMMs reach 60-75% on Hopper and
# Ampere): the time a step's FLOPs take at this rate is its compute-bound part, the rest its memory-bound part.
MATMUL_EFFICIENCY = 0.6
# Which figures a step time is read from, the most trusted first (``cheapest`` prefers them in this order).
BASES = ("measured", "scaled", "cross-type")


@dataclass(frozen=True)
class Config:
    """How a job runs: on what, how many, and how."""

    device: str  # a GPU type, or "cpu"
    count: int  # GPUs, or CPU slots
    parallelism: str  # ddp, fsdp, or SINGLE for one process
    compiled: bool
    precision: str  # resolved: bf16, fp16 or fp32
    share: bool = False  # a fraction of one GPU through MPS


@dataclass(frozen=True)
class Shape:
    """What decides a step's work: a key (the recipe's model and per-rank batch, as text) and, where kiln knows the
    recipe's arithmetic, the FLOPs one rank does per optimizer step."""

    recipe: str
    key: str
    flops_per_rank_step: float | None = None
    label: str = ""


@dataclass(frozen=True)
class Run:
    """One finished attempt, measured: its steady steps' times, launch to first step, its measured peak memory."""

    shape: Shape
    config: Config
    step_times: tuple[float, ...]
    startup_s: float | None = None
    peak_bytes: int | None = None


@dataclass(frozen=True)
class StepTime:
    median_s: float
    low_s: float  # 10th percentile
    high_s: float  # 90th percentile
    basis: str  # one of BASES
    detail: str  # where it comes from, in words
    samples: int
    runs: int
    startup_s: float | None
    scaled_from: str | None = None  # cross-type: the GPU type it was measured on

    @property
    def label(self) -> str:
        """``measured``, ``scaled``, or ``scaled from H100-80GB`` for a figure carried from another GPU type."""
        return f"scaled from {self.scaled_from}" if self.scaled_from else self.basis


@dataclass(frozen=True)
class Option:
    config: Config
    shape: Shape
    changes: dict[str, object] = field(default_factory=dict)  # spec fields changed from the job as written
    peak_bytes: int | None = None
    memory_basis: str | None = None  # predicted | measured
    capacity_bytes: int | None = None  # what the option's GPU (or share) holds; None: CPU, or not known
    step: StepTime | None = None
    price: float = 0.0  # per GPU-hour (CPU slot-hour)
    hours: float | None = None
    gpu_hours: float | None = None
    gpu_hours_low: float | None = None
    gpu_hours_high: float | None = None
    cost: float | None = None
    meets_deadline: bool | None = None

    @property
    def fits(self) -> bool | None:
        if self.peak_bytes is None or self.capacity_bytes is None:
            return None
        return self.peak_bytes <= self.capacity_bytes


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _pooled(runs: Sequence[Run], scale: float, basis: str, detail: str) -> StepTime:
    times = [t * scale for r in runs for t in r.step_times]
    startups = [r.startup_s for r in runs if r.startup_s is not None]
    return StepTime(
        median_s=statistics.median(times),
        low_s=percentile(times, 0.1),
        high_s=percentile(times, 0.9),
        basis=basis,
        detail=detail,
        samples=len(times),
        runs=len(runs),
        startup_s=statistics.median(startups) if startups else None,
    )


def step_time(shape: Shape, config: Config, history: Iterable[Run]) -> StepTime | None:
    """The step time of ``shape`` run as ``config``, from ``history`` (see the module's doc); None: nothing to go by."""
    same_recipe = [r for r in history if r.shape.recipe == shape.recipe and r.step_times]
    exact = [r for r in same_recipe if r.shape.key == shape.key and r.config == config]
    if exact:
        return _pooled(exact, 1.0, "measured", f"{len(exact)} run(s) of this shape on {describe(config)}")
    if shape.flops_per_rank_step is None:  # code kiln cannot count: the same shape on another type, or nothing
        return _cross_type(shape, config, same_recipe)
    near = [
        r
        for r in same_recipe
        if r.shape.flops_per_rank_step
        and r.config.device == config.device
        and r.config.compiled == config.compiled
        and r.config.precision == config.precision
        and r.config.share == config.share
    ]
    if not near:
        return _cross_type(shape, config, same_recipe)

    def distance(r: Run) -> tuple[bool, float]:
        layout = (r.config.count, r.config.parallelism) != (config.count, config.parallelism)
        return layout, abs(math.log(shape.flops_per_rank_step / r.shape.flops_per_rank_step))  # type: ignore[operator]

    best = min(near, key=distance)
    basis = [r for r in near if r.shape.key == best.shape.key and r.config == best.config]
    ratio = shape.flops_per_rank_step / best.shape.flops_per_rank_step  # type: ignore[operator]
    detail = (
        f"scaled from {best.shape.label or best.shape.key} on {describe(best.config)} by its FLOPs per rank "
        f"(x{ratio:.3g}): not measured"
    )
    return _pooled(basis, ratio, "scaled", detail)


def _cross_type(shape: Shape, config: Config, runs: Sequence[Run]) -> StepTime | None:
    """From another GPU type's runs of the recipe, scaled by FLOPs (another shape) and by the two types' peaks."""
    target = peak_figures(config.device)
    if target is None:
        return None
    near = [
        r
        for r in runs
        if r.config.device != config.device
        and peak_figures(r.config.device) is not None
        and (r.config.compiled, r.config.precision, r.config.share) == (config.compiled, config.precision, config.share)
        and (r.shape.key == shape.key or (r.shape.flops_per_rank_step and shape.flops_per_rank_step))
    ]
    if not near:
        return None

    def distance(r: Run) -> tuple[bool, float]:
        layout = (r.config.count, r.config.parallelism) != (config.count, config.parallelism)
        if r.shape.key == shape.key:
            return layout, 0.0
        return layout, abs(math.log(shape.flops_per_rank_step / r.shape.flops_per_rank_step))  # type: ignore[operator]

    best = min(near, key=distance)
    basis = [r for r in near if r.shape.key == best.shape.key and r.config == best.config]
    flops = 1.0
    if best.shape.key != shape.key:
        flops = shape.flops_per_rank_step / best.shape.flops_per_rank_step  # type: ignore[operator]
    measured = _pooled(basis, flops, "cross-type", "")
    mid, low, high = device_factor(best.config, config, shape.flops_per_rank_step, measured.median_s)
    source = best.config.device
    detail = (
        f"scaled from {best.shape.label or best.shape.key} on {describe(best.config)}"
        + (f" by its FLOPs per rank (x{flops:.3g}) and" if flops != 1.0 else " by")
        + f" the peak figures of {source} and {config.device} (x{mid:.3g}; x{low:.3g}-x{high:.3g} from "
        f"bandwidth-bound to compute-bound): not measured on {config.device}"
    )
    return replace(
        measured,
        median_s=measured.median_s * mid,
        low_s=measured.low_s * low,
        high_s=measured.high_s * high,
        detail=detail,
        scaled_from=source,
    )


def device_factor(source: Config, target: Config, flops: float | None, step_s: float) -> tuple[float, float, float]:
    """What a step time on ``source``'s GPU type is multiplied by on ``target``'s, and its bounds: (estimate, low,
    high). The compute-bound part of the step (``flops`` per rank at ``MATMUL_EFFICIENCY`` of the source's peak,
    at most the whole step) scales by the peak throughputs' ratio, the rest by the bandwidths'. Without a FLOPs
    count, the geometric mean of the two ratios. Both types must be in ``core.gpu_types.PEAKS``."""
    a, b = peak_figures(source.device), peak_figures(target.device)
    assert a is not None and b is not None
    compute = a.tflops(source.precision) / b.tflops(target.precision)
    memory = a.bandwidth_gbs / b.bandwidth_gbs
    low, high = min(compute, memory), max(compute, memory)
    if not flops or step_s <= 0:
        return math.sqrt(compute * memory), low, high
    bound = min(1.0, flops / (a.tflops(source.precision) * 1e12 * MATMUL_EFFICIENCY) / step_s)
    return bound * compute + (1.0 - bound) * memory, low, high


def describe(config: Config) -> str:
    """``2 x H200, ddp, compiled, bf16`` / ``1 CPU slot, eager, fp32`` / ``a share of 1 x H200, ...``."""
    if config.device == "cpu":
        what = f"{config.count} CPU slot" + ("s" if config.count != 1 else "")
    else:
        what = f"{config.count} x {config.device}"
    if config.share:
        what = f"a share of {what}"
    how = [config.parallelism] if config.parallelism != SINGLE else []
    how += ["compiled" if config.compiled else "eager", config.precision]
    return ", ".join([what, *how])


def cost(option: Option, *, steps: int, now: datetime, deadline: datetime | None) -> Option:
    """``option`` with its hours, GPU-hours (and their spread), cost and whether it meets ``deadline``."""
    s = option.step
    if s is None:
        return option
    start = s.startup_s or 0.0
    hours = (start + steps * s.median_s) / 3600.0
    units = option.config.count
    meets = None if deadline is None else (deadline - now).total_seconds() >= hours * 3600.0
    return replace(
        option,
        hours=hours,
        gpu_hours=hours * units,
        cost=hours * units * option.price,
        meets_deadline=meets,
        gpu_hours_low=(start + steps * s.low_s) / 3600.0 * units,
        gpu_hours_high=(start + steps * s.high_s) / 3600.0 * units,
    )


def _qualifies(o: Option) -> bool:
    return o.step is not None and o.cost is not None and o.fits is not False and o.meets_deadline is not False


def cheapest(options: Sequence[Option], written: int | None = None) -> int | None:
    """The index of the cheapest option with a step time that does not overflow its GPU and meets the deadline (where
    there is one); ties go to the fewer GPU-hours, then the shorter run. A measured option is preferred to any
    scaled one, and a scaled one to any carried from another GPU type: a FLOPs ratio knows nothing of
    communication or launch overheads, and peak figures less still, so an estimate is advice to measure, not to
    act on, while a measured one qualifies. The job as written (``written``), where it qualifies,
    gives way only to an option cheaper even at its slow end (90th percentile step time): a saving inside the
    measurements' spread is no reason to change a spec. None when no option qualifies."""
    ok = [
        (BASES.index(o.step.basis), o.cost, o.gpu_hours, o.hours, i)  # type: ignore[union-attr]
        for i, o in enumerate(options)
        if _qualifies(o)
    ]
    if not ok:
        return None
    best = min(ok)[-1]
    if written is None or best == written or not _qualifies(options[written]):
        return best
    b, w = options[best], options[written]
    return best if (b.gpu_hours_high or 0.0) * b.price < (w.cost or 0.0) else written
