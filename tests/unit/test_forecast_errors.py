"""The errors of kiln's forecasts: nearest-rank median and p90, signed and relative errors, unknown and unmeasured
forecasts counted apart, starts inside their range."""

from __future__ import annotations

import pytest

from core.forecast_errors import GPU_HOURS, PEAK_MEMORY, START_TIME, Outcome, percentile, summarize


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 50, None),
        ([7.0], 90, 7.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.0),  # the lower middle: a value that happened
        ([float(v) for v in range(1, 11)], 90, 9.0),  # the 9th of 10
        ([float(v) for v in range(1, 12)], 90, 10.0),  # ceil(9.9) = the 10th of 11
        ([float(v) for v in range(1, 11)], 100, 10.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], p: float, expected: float | None) -> None:
    assert percentile(values, p) == expected


def test_memory_errors_absolute_signed_and_relative() -> None:
    outcomes = [
        Outcome(100.0, 110.0),  # +10, 9.1%
        Outcome(100.0, 95.0),  # -5, 5.3%
        Outcome(200.0, 200.0),  # 0
        Outcome(100.0, 150.0),  # +50, 33%
        Outcome(None, None),  # kiln could not say
        Outcome(100.0, None),  # not measured (yet, or ever)
    ]
    s = summarize(PEAK_MEMORY, "trainer", outcomes)
    assert (s.forecasts, s.unknown, s.measured, s.unit) == (6, 1, 4, "bytes")
    assert (s.median_abs_error, s.p90_abs_error, s.median_error) == (5.0, 50.0, 0.0)
    assert s.median_rel_error == pytest.approx(5 / 95)
    assert s.p90_rel_error == pytest.approx(50 / 150)
    assert s.in_range is None


def test_a_start_has_no_relative_error_and_counts_the_starts_inside_its_range() -> None:
    outcomes = [
        Outcome(60.0, 30.0, 600.0),  # early: before the range
        Outcome(60.0, 300.0, 600.0),  # inside
        Outcome(60.0, 900.0, 600.0),  # late: after it
        Outcome(0.0, 0.5),  # foretold to start now (a range of one time), running once its worker started it
        Outcome(0.0, 10.5),  # later than the worker's start explains
    ]
    s = summarize(START_TIME, "scheduler", outcomes)
    assert (s.measured, s.in_range, s.unit) == (5, 2, "s")
    assert (s.median_abs_error, s.p90_abs_error) == (30.0, 840.0)
    assert s.median_rel_error is None and s.p90_rel_error is None


def test_nothing_measured_gives_no_error() -> None:
    s = summarize(GPU_HOURS, "estimate", [Outcome(1.0, None), Outcome(None, 2.0)])
    assert (s.forecasts, s.unknown, s.measured) == (2, 1, 0)
    assert s.median_abs_error is s.p90_abs_error is s.median_rel_error is None


def test_a_measured_zero_has_no_relative_error() -> None:
    s = summarize(GPU_HOURS, "estimate", [Outcome(0.5, 0.0), Outcome(1.0, 2.0)])
    assert s.median_abs_error == 0.5 and s.median_rel_error == 0.5 and s.p90_rel_error == 0.5
