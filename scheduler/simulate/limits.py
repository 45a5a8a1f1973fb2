"""The time limits users give the replay's jobs: two models, chosen with ``kiln simulate --limits``.

The Philly trace has no user estimates, so the replay draws them, seeded per job id (``--limit-seed``):

* ``overestimating`` (the default, and every figure before 2026-12-07): none for ``NO_LIMIT_SHARE`` of jobs;
  otherwise the run time times a log-normal overestimate (median 3x, sigma 0.8) that is never below 1.1x, rounded
  up to the round figures users type. No job ever runs into its limit unless preemptions push it there.
* ``underestimating``: the same, except that ``underestimate_share`` of the jobs with a limit get one below their
  run time (the run time times a factor drawn uniformly from ``UNDER_FACTOR``, rounded *down* to a round figure).
  Such a job is killed at its limit as Slurm kills it (``plan()``'s ``time_limit_kills``, after the grace), everything
  it ran is lost (a new kiln job resumes nothing of the killed one), and its user resubmits it ``RESUBMIT_DELAY_S``
  later with ``RESUBMIT_FACTOR`` times the limit, rounded up: again, until a limit is long enough.

Where the numbers come from (docs/scheduler.md, "Trace replay", says the same): HPC studies report users'
estimates as poor and jobs killed at their limits (Mu'alem & Feitelson, IEEE TPDS 2001; Lee et al., JSSPP 2004;
Tsafrir, Etsion & Feitelson, IEEE TPDS 2007; Jakobsche et al., arXiv:2505.05927, 2025, on the work lost by jobs
that time out), and sites tell users whose job timed out to resubmit it with a longer limit. The share of jobs that
time out varies by site; 15% of the jobs with a limit (9% of all jobs) is this model's stated choice, not a
measurement, and ``--underestimate-share`` replays any other.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

LIMIT_SEED = 16
NO_LIMIT_SHARE = 0.4
OVERESTIMATE_MEDIAN = 3.0
OVERESTIMATE_SIGMA = 0.8
MIN_OVERESTIMATE = 1.1
LIMIT_LADDER_H = (1, 2, 4, 8, 12, 24, 48, 72, 120, 168, 336, 720, 1440)
UNDERESTIMATE_SHARE = 0.15
UNDER_FACTOR = (0.3, 0.95)  # a killed job's limit over its run time
MIN_LIMIT_S = 600.0  # below the ladder's first rung a user types minutes; never under 10
RESUBMIT_FACTOR = 2.0  # the user doubles the limit that killed the job
RESUBMIT_DELAY_S = 1800.0  # between the kill and the resubmission: the user notices, edits, submits


@dataclass(frozen=True, slots=True)
class LimitModel:
    name: str
    underestimate_share: float = 0.0
    resubmit: bool = False  # a job killed at its limit comes back as a new job (else it has failed)

    def draw(self, job_id: str, work: float, seed: int = LIMIT_SEED) -> float | None:
        """The limit the user gives a job that truly runs ``work`` seconds (seeded per job id)."""
        rng = random.Random(f"{seed}:{job_id}")
        if rng.random() < NO_LIMIT_SHARE:
            return None
        over = max(MIN_OVERESTIMATE, rng.lognormvariate(math.log(OVERESTIMATE_MEDIAN), OVERESTIMATE_SIGMA))
        # A second stream decides the underestimates, so the other jobs keep the default model's limits exactly.
        under = random.Random(f"{seed}:{job_id}:under")
        if under.random() < self.underestimate_share:
            return rounded_down(work * under.uniform(*UNDER_FACTOR))
        return rounded_up(work * over)


OVERESTIMATING = LimitModel("overestimating")
UNDERESTIMATING = LimitModel("underestimating", UNDERESTIMATE_SHARE, resubmit=True)
MODELS = {m.name: m for m in (OVERESTIMATING, UNDERESTIMATING)}


def model(name: str, underestimate_share: float | None = None) -> LimitModel:
    """A model by name, ``underestimate_share`` replacing the underestimating model's share where given."""
    base = MODELS[name]
    if underestimate_share is None or not base.resubmit:
        return base
    return LimitModel(base.name, underestimate_share, base.resubmit)


def user_time_limit(job_id: str, work: float, seed: int = LIMIT_SEED) -> float | None:
    """The default model's limit (``OVERESTIMATING``): never below 1.1x the run time, rounded up."""
    return OVERESTIMATING.draw(job_id, work, seed)


def rounded_up(seconds: float) -> float:
    """The round figure a user types for at least ``seconds``: a rung of the ladder, else whole days."""
    for hours in LIMIT_LADDER_H:
        if hours * 3600.0 >= seconds:
            return hours * 3600.0
    return math.ceil(seconds / 86400.0) * 86400.0


def rounded_down(seconds: float) -> float:
    """The round figure a user types for at most ``seconds`` (an underestimate stays one): whole days past the
    ladder, a rung of it, else whole 10 minutes, never under ``MIN_LIMIT_S``."""
    if seconds >= LIMIT_LADDER_H[-1] * 3600.0:
        return math.floor(seconds / 86400.0) * 86400.0
    rungs = [h * 3600.0 for h in LIMIT_LADDER_H if h * 3600.0 <= seconds]
    if rungs:
        return rungs[-1]
    return max(MIN_LIMIT_S, math.floor(seconds / MIN_LIMIT_S) * MIN_LIMIT_S)


def resubmitted_limit(killed_at: float) -> float:
    """The limit a user gives the job again after it was killed at ``killed_at``."""
    return rounded_up(killed_at * RESUBMIT_FACTOR)
