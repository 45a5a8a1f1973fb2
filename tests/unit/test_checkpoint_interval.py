"""Young's and Daly's checkpoint intervals and the expected loss (``core.checkpoint_interval``)."""

from __future__ import annotations

import math

import pytest

from core.checkpoint_interval import daly_interval_s, expected_loss_s, expected_wall_s, young_interval_s


def test_young_is_the_square_root_of_twice_cost_times_mtbf() -> None:
    assert young_interval_s(4.1, 38 * 3600) == pytest.approx(math.sqrt(2 * 4.1 * 38 * 3600))  # ~1059 s


def test_daly_agrees_with_young_when_the_cost_is_small_and_departs_when_it_is_not() -> None:
    small = daly_interval_s(4.1, 38 * 3600)
    assert small == pytest.approx(young_interval_s(4.1, 38 * 3600), rel=0.01)
    # a save of 10 minutes against an MTBF of 1.5 h: Daly's eq. 37 by hand
    c, m = 600.0, 5400.0
    x = c / (2 * m)
    assert daly_interval_s(c, m) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c)
    assert daly_interval_s(c, m) < young_interval_s(c, m)
    assert daly_interval_s(3 * m, m) == m  # a cost past twice the MTBF: checkpoint once per MTBF


def test_the_advised_interval_minimises_the_expected_loss() -> None:
    c, r, m, w = 60.0, 90.0, 10 * 3600.0, 200 * 3600.0
    best = daly_interval_s(c, m)
    at_best = expected_loss_s(w, best, c, r, m)
    for k in (0.5, 0.8, 1.25, 2.0):
        assert expected_loss_s(w, best * k, c, r, m) > at_best


def test_without_failures_only_the_checkpoints_cost() -> None:
    assert expected_wall_s(1000.0, 100.0, 5.0, 60.0, math.inf) == pytest.approx(1050.0)
