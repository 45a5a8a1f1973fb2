"""How far kiln's forecasts were from what happened: median and p90 of the errors, per kind and source.

The error of one forecast is ``actual - predicted`` in the kind's unit (positive: later, bigger or slower than
foretold). The relative error divides its absolute value by the measured value; a start time has none, since a job
that starts within seconds of its forecast would read as hundreds of percent off a wait of one second. A start is
foretold as a range (earliest to latest): its error is measured from the earliest, the time ``kiln why`` leads with,
and ``in_range`` says how many starts fell inside the range, or within ``START_SLACK_S`` of it: a range is of
admissions, and the attempt runs only once dispatched and started by its worker (0.5 s after the scheduler's pass on
the CPU worker of ``kiln up``), so a job forecast to start "now" and running half a second later was forecast right.

Percentiles are nearest-rank (the smallest value with at least p% of the values at or below it): with 10 errors the
p90 is the 9th smallest, always an error that happened, never an interpolation between two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

START_TIME = "start_time"
PEAK_MEMORY = "peak_memory"
STEP_TIME = "step_time"
GPU_HOURS = "gpu_hours"
KINDS: dict[str, str] = {START_TIME: "s", PEAK_MEMORY: "bytes", STEP_TIME: "s", GPU_HOURS: "GPU-hours"}
# Who forecast it: the scheduler's pass, the memory predictor at submit, the trainer on its device, kiln estimate.
SCHEDULER, SUBMIT, TRAINER, ESTIMATE = "scheduler", "submit", "trainer", "estimate"
START_SLACK_S = 10.0
RELATIVE = frozenset({PEAK_MEMORY, STEP_TIME, GPU_HOURS})  # kinds whose relative error means something


@dataclass(frozen=True)
class Outcome:
    """One forecast as stored: ``predicted`` None when kiln said it cannot be known, ``actual`` None while (or
    when for ever) nothing was measured."""

    predicted: float | None
    actual: float | None
    predicted_high: float | None = None


@dataclass(frozen=True)
class ErrorSummary:
    kind: str
    source: str
    unit: str
    forecasts: int  # made in the window
    unknown: int  # of those, the ones kiln said cannot be known
    measured: int  # with a forecast and a measured value: the errors below are over these
    median_abs_error: float | None
    p90_abs_error: float | None
    median_error: float | None  # signed: which way kiln leans
    median_rel_error: float | None  # a share (0.05 = 5%); None for kinds without one
    p90_rel_error: float | None
    in_range: int | None  # starts inside their range (None for kinds foretold as one value)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summarize(kind: str, source: str, outcomes: Sequence[Outcome]) -> ErrorSummary:
    """The errors of ``outcomes`` (one kind, one source)."""
    pairs = [(o.predicted, o.actual, o.predicted_high) for o in outcomes if o.predicted is not None]
    measured = [(p, a, hi) for p, a, hi in pairs if a is not None]
    errors = [a - p for p, a, _ in measured]
    absolute = [abs(e) for e in errors]
    relative = [abs(a - p) / a for p, a, _ in measured if a > 0] if kind in RELATIVE else []
    in_range = sum(1 for p, a, hi in measured if _inside(p, a, hi)) if kind == START_TIME else None
    return ErrorSummary(
        kind=kind,
        source=source,
        unit=KINDS.get(kind, ""),
        forecasts=len(outcomes),
        unknown=len(outcomes) - len(pairs),
        measured=len(measured),
        median_abs_error=percentile(absolute, 50),
        p90_abs_error=percentile(absolute, 90),
        median_error=percentile(errors, 50),
        median_rel_error=percentile(relative, 50),
        p90_rel_error=percentile(relative, 90),
        in_range=in_range,
    )


def _inside(earliest: float, actual: float, latest: float | None) -> bool:
    return earliest - START_SLACK_S <= actual <= (latest if latest is not None else earliest) + START_SLACK_S
