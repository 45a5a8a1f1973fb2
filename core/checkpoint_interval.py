"""The checkpoint interval that loses the least to failures: Young's and Daly's formulas, and the expected loss.

A job that checkpoints every ``tau`` seconds of training, each checkpoint costing it ``C`` seconds, restarting in
``R`` seconds after a failure, with failures arriving at random at a mean time between failures ``M``, spends on
average (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", eq. 20)

    T_wall = M * exp(R / M) * (exp((tau + C) / M) - 1) * W / tau

to do ``W`` seconds of work. Young (1974) minimised the first-order form: ``tau = sqrt(2 C M)``; Daly's higher
order form stays right where ``C`` is not small against ``M``. Everything here is in seconds.
"""

from __future__ import annotations

import math


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's optimum: seconds of training between checkpoints."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (his eq. 37): Young's, corrected for a cost not small against the MTBF; the MTBF
    itself once the cost reaches twice it (checkpointing more often then only adds cost)."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s


def expected_wall_s(work_s: float, interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall time to do ``work_s`` of training (Daly's eq. 20, above)."""
    if math.isinf(mtbf_s):
        return work_s * (interval_s + cost_s) / interval_s
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + cost_s) / mtbf_s) * work_s / interval_s


def expected_loss_s(work_s: float, interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected seconds lost to checkpoints, failures' lost work and restarts, over ``work_s`` of training."""
    return expected_wall_s(work_s, interval_s, cost_s, restart_s, mtbf_s) - work_s
