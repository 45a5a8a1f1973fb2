"""Start-time forecasts held to account on a replay: each job's start, estimated at its submission from what the
live system would know then, against the start the replay then gives it.

At the cycle in which a job is submitted, with the very snapshot that cycle hands ``plan()``, the start is projected
(``projection.project``: ``plan()`` run forward, as ``kiln why`` does, within its bounds of 64 ends and 14 days, but
without its 0.5 s of CPU, so the figures do not depend on the box) under the two scenarios of
``projection.scenarios``:

* **kiln**: the earliest scenario, kiln's own expectation: running jobs end as the policy expects them to (the
  user's limit scaled by the team's median use of its limits, or the team's history), admitted jobs run as long;
* **slurm**: the latest scenario, which is Slurm's method (``squeue --start``, its backfill plan): every job runs
  to its time limit. A job without a limit holds its GPUs for ever there, so a job waiting on one gets no estimate.

``kiln why`` shows the two as a range; ``in_range`` is how often the actual start fell inside it. With
``progress=True`` a third forecast, **kiln+progress**, gives the earliest scenario each running job's true remaining
time, as a job's steps left over its measured step rate would give it were every trace job a fixed number of steps
at a steady pace (the trace's run times include failed attempts, so this is a bound on what progress reports buy,
not a forecast the replay's jobs could have).

Jobs submitted later (a higher class goes ahead), preemptions and kills at a limit are not foreseen by either.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.policy_config import PolicyConfig
from scheduler.policy.snapshot import Snapshot
from scheduler.simulate.projection import HORIZON_S, MAX_EVENTS, Ends, Start, project, scenarios

if TYPE_CHECKING:
    from scheduler.simulate.simulation import Simulation

METHODS = ("kiln", "slurm", "kiln+progress")
WAITED_S = 60.0  # a job that started within a minute of its submission "did not wait"


@dataclass
class Forecast:
    job: int
    submitted: float
    at: dict[str, float | None]  # method -> forecast start (None: no estimate)
    stopped: dict[str, str | None]  # method -> why there is none ("unknown", "events", "horizon", ...)
    actual: float | None = None


class ForecastRecorder:
    """A replay ``Observer``: forecasts every ``every``-th submission, and settles it at the job's next start."""

    def __init__(self, config: PolicyConfig, *, every: int = 1, progress: bool = False) -> None:
        self.config, self.every, self.progress = config, max(1, every), progress
        self.seen = 0
        self.open: dict[int, Forecast] = {}
        self.done: list[Forecast] = []

    def submitted(self, sim: Simulation, snapshot: Snapshot, job_ids: list[int]) -> None:
        chosen = [jid for i, jid in enumerate(job_ids, self.seen) if i % self.every == 0]
        self.seen += len(job_ids)
        if not chosen:
            return
        runs = self._scenarios(sim, snapshot)
        for jid in chosen:
            starts = {name: self._project(snapshot, jid, ends) for name, ends in runs.items()}
            at = {n: s.at for n, s in starts.items()}
            self.open[jid] = Forecast(jid, snapshot.now, at, {n: s.stopped for n, s in starts.items()})

    def started(self, job_id: int, now: float) -> None:
        forecast = self.open.pop(job_id, None)
        if forecast is not None:
            forecast.actual = now
            self.done.append(forecast)

    def _scenarios(self, sim: Simulation, snapshot: Snapshot) -> dict[str, Ends]:
        grace = self.config.time_limit_grace_s
        early, late = scenarios(snapshot, {}, grace)
        runs = {"kiln": early, "slurm": late}
        if self.progress:
            rates = {r.id: (sim.true_remaining_s(r.id, snapshot.now), 1.0) for r in snapshot.running}
            runs["kiln+progress"] = scenarios(snapshot, rates, grace)[0]
        return runs

    def _project(self, snapshot: Snapshot, jid: int, ends: Ends) -> Start:
        return project(snapshot, self.config, jid, ends, horizon_s=HORIZON_S, max_events=MAX_EVENTS)


def _quantile(xs: list[float], q: float) -> float:
    """Nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.5) - 1))] if s else 0.0


def errors(forecasts: list[Forecast], method: str) -> dict[str, Any]:
    """Absolute error of ``method`` against the actual start (hours): median, p90, mean, and the median signed
    error (negative: too early), over the forecasts it gave; ``given``: the share it gave one at all."""
    pairs = [(f.at[method], f.actual) for f in forecasts if method in f.at and f.actual is not None]
    given = [(at, actual) for at, actual in pairs if at is not None]
    abs_h = [abs(at - actual) / 3600 for at, actual in given]
    signed_h = [(at - actual) / 3600 for at, actual in given]
    return {
        "forecasts": len(pairs),
        "given": round(len(given) / len(pairs), 4) if pairs else 0.0,
        "median_abs_h": round(_quantile(abs_h, 0.5), 2),
        "p90_abs_h": round(_quantile(abs_h, 0.9), 2),
        "mean_abs_h": round(statistics.fmean(abs_h), 2) if abs_h else 0.0,
        "median_signed_h": round(_quantile(signed_h, 0.5), 2),
    }


def summary(forecasts: list[Forecast]) -> dict[str, Any]:
    """Each method's errors over every settled forecast, over the jobs that waited, and over the forecasts every
    method gave (the fair comparison); and how often the actual start fell within kiln's range."""
    settled = [f for f in forecasts if f.actual is not None]
    waited = [f for f in settled if f.actual is not None and f.actual - f.submitted > WAITED_S]
    methods = [m for m in METHODS if settled and m in settled[0].at]
    common = [f for f in settled if all(f.at[m] is not None for m in methods)]
    ranged = [f for f in settled if f.at["kiln"] is not None and f.at["slurm"] is not None]
    inside = [f for f in ranged if _within(f)]
    return {
        "settled": len(settled),
        "waited": len(waited),
        "all": {m: errors(settled, m) for m in methods},
        "waited_only": {m: errors(waited, m) for m in methods},
        "where_every_method_gave_one": {m: errors(common, m) for m in methods},
        "in_kiln_range": round(len(inside) / len(ranged), 4) if ranged else 0.0,
        "no_estimate_why": {m: _reasons(settled, m) for m in methods},
    }


def _within(f: Forecast) -> bool:
    lo, hi = f.at["kiln"], f.at["slurm"]
    assert lo is not None and hi is not None and f.actual is not None
    return min(lo, hi) - 1.0 <= f.actual <= max(lo, hi) + 1.0


def _reasons(forecasts: list[Forecast], method: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in forecasts:
        if f.at[method] is None:
            why = f.stopped[method] or "none"
            out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items()))
