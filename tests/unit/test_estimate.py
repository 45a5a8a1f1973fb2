"""The estimate's arithmetic (``core.estimate``): which measurements a step time is read from, its spread, the
FLOPs scaling of an unseen shape, GPU-hours and cost, and which option is the cheapest that qualifies."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from core.estimate import (
    MATMUL_EFFICIENCY,
    SINGLE,
    Config,
    Option,
    Run,
    Shape,
    StepTime,
    cheapest,
    cost,
    describe,
    percentile,
    step_time,
)

NOW = datetime(2026, 12, 7, tzinfo=UTC)
ONE = Config("H200", 1, SINGLE, True, "bf16")
TWO = Config("H200", 2, "ddp", True, "bf16")
SMALL = Shape("gpt", "small b8", 1e12, "gpt small b8")
LARGE = Shape("gpt", "small b16", 2e12, "gpt small b16")


def run(
    shape: Shape = SMALL,
    config: Config = ONE,
    times: tuple[float, ...] = (0.1,) * 10,
    startup: float = 20.0,
) -> Run:
    return Run(shape, config, times, startup)


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert percentile([7.0], 0.9) == 7.0


def test_measured_pools_the_same_shape_and_configuration_only() -> None:
    history = [
        run(times=(0.1, 0.1, 0.1, 0.2), startup=10),
        run(times=(0.1, 0.3), startup=30),
        run(config=TWO, times=(9.0,)),  # another configuration
        run(shape=LARGE, times=(9.0,)),  # another shape
        Run(Shape("mlp", SMALL.key, 1e12), ONE, (9.0,)),  # another recipe with the same key
    ]
    s = step_time(SMALL, ONE, history)
    assert s is not None and s.basis == "measured"
    assert (s.median_s, s.samples, s.runs, s.startup_s) == (0.1, 6, 2, 20.0)
    assert s.low_s == pytest.approx(0.1) and s.high_s == pytest.approx(0.25)


def test_an_unseen_shape_is_scaled_by_flops_from_the_nearest_and_labelled() -> None:
    tiny = Shape("gpt", "tiny", 1e10, "gpt tiny")
    history = [run(shape=tiny, times=(0.01,)), run(times=(0.1,) * 3)]
    s = step_time(LARGE, ONE, history)
    assert s is not None and s.basis == "scaled"
    assert s.median_s == pytest.approx(0.2)  # from SMALL (x2), not from tiny (x200)
    assert "scaled from gpt small b8" in s.detail and "not measured" in s.detail


def test_scaling_prefers_the_same_layout_and_never_crosses_device_compile_or_precision() -> None:
    history = [run(config=TWO, times=(0.5,)), run(shape=LARGE, times=(0.3,))]
    s = step_time(SMALL, TWO, history)  # SMALL on TWO is measured
    assert s is not None and s.basis == "measured"
    s = step_time(LARGE, TWO, history)  # LARGE on TWO: scaled from SMALL on TWO, not from LARGE on ONE
    assert s is not None and s.median_s == pytest.approx(1.0)
    others = [
        replace(ONE, device="H100-PCIE"),  # another GPU type, with no published figures in kiln's table
        replace(ONE, compiled=False),
        replace(ONE, precision="fp32"),
        replace(ONE, share=True),
    ]
    for other in others:
        assert step_time(SMALL, other, history) is None


def test_code_kiln_cannot_count_is_measured_or_nothing() -> None:
    mine = Shape("digits", "digits: channels=16", None)
    history = [run(shape=Shape("digits", "digits: channels=8", None), times=(0.05,))]
    assert step_time(mine, ONE, history) is None
    assert step_time(mine, ONE, [*history, run(shape=mine, times=(0.07,))]) is not None


def test_cost_counts_start_up_every_gpu_and_the_price() -> None:
    s = step_time(SMALL, TWO, [run(config=TWO, times=(0.1, 0.1, 0.3), startup=36.0)])
    assert s is not None
    o = cost(Option(TWO, SMALL, step=s, price=4.5), steps=1000, now=NOW, deadline=None)
    assert o.hours == pytest.approx((36 + 100) / 3600)
    assert o.gpu_hours == pytest.approx(2 * 136 / 3600)
    assert o.cost == pytest.approx(4.5 * 2 * 136 / 3600)
    assert o.gpu_hours_low == pytest.approx(2 * 136 / 3600)
    assert o.gpu_hours_high == pytest.approx(2 * (36 + 1000 * s.high_s) / 3600)
    assert o.meets_deadline is None
    assert cost(o, steps=1000, now=NOW, deadline=NOW + timedelta(seconds=136)).meets_deadline is True
    assert cost(o, steps=1000, now=NOW, deadline=NOW + timedelta(seconds=135)).meets_deadline is False
    assert cost(Option(TWO, SMALL), steps=10, now=NOW, deadline=None).cost is None  # no step time, no cost


def _priced(gpu_hours: float, basis: str = "measured", peak: int | None = None, meets: bool | None = None) -> Option:
    """An option of ``gpu_hours`` for 100 steps on one GPU at 1 a GPU-hour."""
    step = StepTime(gpu_hours * 36, gpu_hours * 36, gpu_hours * 36, basis, "", 1, 1, None)
    o = cost(
        Option(ONE, SMALL, step=step, price=1.0, peak_bytes=peak, capacity_bytes=100), steps=100, now=NOW, deadline=None
    )
    return replace(o, meets_deadline=meets)


def test_the_cheapest_that_fits_and_meets_the_deadline_measured_before_scaled() -> None:
    assert cheapest([_priced(2.0), _priced(1.0), _priced(3.0)]) == 1
    assert cheapest([_priced(2.0), _priced(1.0, peak=101)]) == 0  # over its GPU's memory
    assert cheapest([_priced(2.0), _priced(1.0, meets=False), _priced(3.0, meets=True)]) == 0
    assert cheapest([_priced(2.0), _priced(0.5, basis="scaled")]) == 0  # a scaled figure is advice to measure
    assert cheapest([_priced(2.0, basis="scaled"), _priced(0.5, basis="scaled")]) == 1  # all scaled: the cheapest
    assert cheapest([_priced(2.0, basis="scaled"), _priced(0.5, basis="cross-type")]) == 0  # peaks: less still
    assert cheapest([Option(ONE, SMALL), _priced(1.0, meets=False)]) is None


def test_the_job_as_written_gives_way_only_to_a_saving_beyond_the_spread() -> None:
    def spread(gpu_hours: float, high: float) -> Option:
        o = _priced(gpu_hours)
        return replace(o, gpu_hours_high=high)

    assert cheapest([_priced(2.0), spread(1.8, 2.1)], written=0) == 0  # 10% cheaper, but 5% dearer at its p90
    assert cheapest([_priced(2.0), spread(1.8, 1.9)], written=0) == 1
    assert cheapest([_priced(2.0, meets=False), spread(1.8, 2.1)], written=0) == 1  # as written misses the deadline


def test_describe_says_the_configuration_in_words() -> None:
    assert describe(TWO) == "2 x H200, ddp, compiled, bf16"
    assert describe(Config("cpu", 1, SINGLE, False, "fp32")) == "1 CPU slot, eager, fp32"
    assert describe(Config("H200", 1, SINGLE, True, "bf16", share=True)) == "a share of 1 x H200, compiled, bf16"


H100 = Config("H100-80GB", 1, SINGLE, True, "bf16")


def test_a_type_with_no_run_is_scaled_from_another_types_runs_by_their_peaks_and_labelled() -> None:
    """H200 -> H100-80GB: the same bf16 peak, 4.8 against 3.35 TB/s. SMALL's 1e12 FLOPs at 60% of 989 TFLOPS take
    1.685 ms of its 0.1 s step: 1.7% compute-bound, the rest scales by the bandwidths (x1.43)."""
    s = step_time(SMALL, H100, [run(times=(0.1,) * 9 + (0.12,))])
    assert s is not None and (s.basis, s.scaled_from, s.label) == ("cross-type", "H200", "scaled from H200")
    compute_part = 1e12 / (989e12 * MATMUL_EFFICIENCY) / 0.1
    factor = compute_part * 1.0 + (1 - compute_part) * 4800 / 3350
    assert s.median_s == pytest.approx(0.1 * factor)
    assert s.low_s == pytest.approx(0.1) and s.high_s == pytest.approx(0.102 * 4800 / 3350)  # compute- to memory-bound
    assert "scaled from gpt small b8 on 1 x H200, compiled, bf16 by the peak figures of H200 and H100-80GB" in s.detail
    assert "not measured on H100-80GB" in s.detail


def test_a_compute_bound_step_scales_by_the_peak_throughputs() -> None:
    """A100-80GB -> H100-80GB, a step whose FLOPs at 60% of the A100's peak take all of it: x312/989."""
    a100 = replace(ONE, device="A100-80GB")
    heavy = Shape("gpt", "big", 312e12 * MATMUL_EFFICIENCY * 0.5, "gpt big")
    s = step_time(heavy, H100, [run(shape=heavy, config=a100, times=(0.5,))])
    assert s is not None and s.median_s == pytest.approx(0.5 * 312 / 989)
    assert (s.low_s, s.high_s) == (pytest.approx(0.5 * 312 / 989), pytest.approx(0.5 * 2039 / 3350))


def test_cross_type_scales_another_shape_by_flops_too_and_keeps_compile_precision_and_share() -> None:
    s = step_time(LARGE, H100, [run(times=(0.1,))])  # LARGE never ran anywhere: x2 by FLOPs, then by the peaks
    assert s is not None and s.scaled_from == "H200" and "by its FLOPs per rank (x2)" in s.detail
    assert s.median_s == pytest.approx(2 * step_time(SMALL, H100, [run(times=(0.1,))]).median_s)  # type: ignore[union-attr]
    for other in (replace(H100, compiled=False), replace(H100, precision="fp32"), replace(H100, share=True)):
        assert step_time(SMALL, other, [run(times=(0.1,))]) is None
    code = Shape("digits", "digits: channels=8", None)  # no FLOPs count: the same key only
    assert step_time(code, H100, [run(shape=code, times=(0.1,))]) is not None
    assert step_time(replace(code, key="digits: channels=16"), H100, [run(shape=code, times=(0.1,))]) is None


def test_the_same_type_is_preferred_to_another_types_runs() -> None:
    history = [run(config=H100, times=(0.3,)), run(times=(0.1,))]
    s = step_time(LARGE, H100, history)  # H100 SMALL scaled by FLOPs, not H200 LARGE
    assert s is not None and (s.basis, s.scaled_from) == ("scaled", None) and s.median_s == pytest.approx(0.6)
