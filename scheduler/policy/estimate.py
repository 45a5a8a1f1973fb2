"""How much service a job still needs, from what kiln really knows: never the job's true run time.

What the live loop knows about a job is its user's time limit (often absent, usually several times too long), the
service it has attained (seconds its earlier attempts ran) and kiln's own history of the team's finished jobs
(their run times, and how much of their time limits they used). From those:

* with a time limit: what is left of the limit after the attained service, scaled by the team's median use of
  its limits (users ask for several times what they use);
* without one: the mean residual life of the team's finished run times given what the job has attained (the
  Gittins-index view of Tiresias: the longer a job has run, the longer it is expected to run, as heavy-tailed
  DL training times do); with no history, or past everything in it, as long again as it has run.

The estimate only orders jobs (discretised into service classes, so small differences cause no churn) and projects
when running jobs will end; no limit is enforced from it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.policy.snapshot import TeamInfo

DEFAULT_LIMIT_USE = 0.5  # share of its time limit a job uses, before the team has history
DEFAULT_UNKNOWN_S = 4 * 3600.0  # expected run time of a job with no limit and no team history
MIN_REMAINING_S = 60.0


@dataclass(frozen=True, slots=True)
class _History:
    runtimes: tuple[float, ...]  # ascending
    suffix: tuple[float, ...]  # suffix[i] = sum(runtimes[i:])
    limit_use: float


class Estimator:
    """Per-cycle estimates of remaining service, with each team's history indexed once."""

    def __init__(self, teams: Iterable[TeamInfo]) -> None:
        self.history: dict[int, _History] = {}
        for t in teams:
            rts = tuple(t.finished_runtimes_s)
            suffix = [0.0] * (len(rts) + 1)
            for i in range(len(rts) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + rts[i]
            use = t.limit_use_ratio if t.limit_use_ratio is not None else DEFAULT_LIMIT_USE
            self.history[t.id] = _History(rts, tuple(suffix), min(1.0, max(0.05, use)))

    def remaining_s(self, team_id: int, time_limit_s: float | None, attained_s: float) -> float:
        """Expected seconds of run time still needed."""
        h = self.history.get(team_id)
        if time_limit_s is not None:
            use = h.limit_use if h is not None else DEFAULT_LIMIT_USE
            return max(MIN_REMAINING_S, (time_limit_s - attained_s) * use)
        if h is None or not h.runtimes:
            return max(MIN_REMAINING_S, DEFAULT_UNKNOWN_S - attained_s, attained_s)
        i = bisect.bisect_right(h.runtimes, attained_s)
        n = len(h.runtimes) - i
        if n == 0:
            return max(MIN_REMAINING_S, attained_s)
        return max(MIN_REMAINING_S, h.suffix[i] / n - attained_s)


def service_class(gpu_seconds: float, base_gpu_s: float, factor: float) -> int:
    """Discretised expected remaining service (Tiresias' queues): 0 below ``base_gpu_s``, then one class per
    ``factor`` times more. Jobs of one class are ordered among themselves by fair share and age, not by estimate."""
    if gpu_seconds <= base_gpu_s:
        return 0
    return 1 + int(math.log(gpu_seconds / base_gpu_s) / math.log(factor))
