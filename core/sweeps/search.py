"""Adaptive sweeps (``search: tpe``): the next jobs' settings proposed from the jobs that ended, and the scheduler's
step that submits them.

A sweep with ``search: tpe`` starts with ``initial`` random draws of its ``random`` section; each time fewer of its
jobs are unfinished than it runs at once (``max_concurrent``, else ``initial``), the scheduler's cycle proposes
the next ones from those that ended, until ``count`` jobs in all (Optuna's ask/tell loop, Katib's and W&B's
Bayesian sweeps; ``propose_due``).

The proposal is a tree-structured Parzen estimator (TPE; Bergstra et al., NeurIPS 2011; Optuna's default sampler).
The ended jobs are split by their value of the sweep's objective: the best quarter ("good"; at least one, at most
25) and the rest ("bad": a job that failed or that early stopping stopped is always bad). For each key, a Parzen
estimator (one kernel per job, plus the key's own distribution as a prior) of the good jobs' values, ``l(x)``, and
of the bad jobs', ``g(x)``. Candidates are drawn from ``l``; the one with the largest ``l(x) / g(x)`` (a product over
the keys, taken as independent as Optuna's default takes them) is proposed. Numbers are modelled on their own scale
(the logarithm for ``log_uniform``) by Gaussians truncated to the range, each as wide as the gap to its
neighbours (Bergstra's rule); a list's values as categories, each job's value counted against a uniform prior.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Job, Sweep
from core.repositories import jobs as jobs_repo
from core.repositories import teams as teams_repo
from core.repositories import users as users_repo
from core.services import jobs as jobs_svc
from core.services.errors import Forbidden, InvalidInput, NotFound, ServiceError
from core.services.fit import FitSettings
from core.services.principal import Principal
from core.spec import SpecError, parse_spec_data
from core.states import TERMINAL, JobState
from core.sweeps import service as sweeps
from core.sweeps.ranking import Objective, objective_of, stopped_early, value_of
from core.sweeps.spec import Distribution, SweepSection, expand, space_of

GAMMA = 0.25  # the share of the ended jobs that is "good"
MAX_GOOD = 25
CANDIDATES = 24  # drawn from l(x) per proposal (Optuna's n_ei_candidates)

Observation = tuple[Mapping[str, Any], float | None]  # (settings, value: lower is better; None: always bad)


@dataclass(frozen=True)
class _Numeric:
    """A key's range on the scale it is modelled on: the logarithm for ``log_uniform``, half a unit wider at each
    end for ``int_uniform`` (so each integer has as much room)."""

    low: float
    high: float
    log: bool
    integer: bool

    @classmethod
    def of(cls, dist: Distribution) -> _Numeric:
        if dist.kind == "log_uniform":
            return cls(math.log(dist.low), math.log(dist.high), True, False)
        if dist.kind == "int_uniform":
            return cls(dist.low - 0.5, dist.high + 0.5, False, True)
        return cls(dist.low, dist.high, False, False)

    def scale(self, value: Any) -> float:
        return math.log(value) if self.log else float(value)

    def unscale(self, x: float, dist: Distribution) -> Any:
        if self.integer:
            return min(max(round(x), int(dist.low)), int(dist.high))
        return dist.kept(math.exp(x) if self.log else x)


class _Parzen:
    """A mixture of Gaussians truncated to ``[low, high]``: one per observed value, and the prior (the range's
    middle, as wide as the range)."""

    def __init__(self, points: Sequence[float], space: _Numeric) -> None:
        self.low, self.high = space.low, space.high
        width = self.high - self.low
        if width <= 0:
            self.mus, self.sigmas = [self.low], [1.0]
            return
        mus = sorted(points)
        sigmas = []
        for i, mu in enumerate(mus):
            left = mus[i - 1] if i > 0 else self.low
            right = mus[i + 1] if i + 1 < len(mus) else self.high
            sigmas.append(min(max(mu - left, right - mu), width))
        floor = width / min(100.0, len(mus) + 1.0)
        self.mus = [*mus, (self.low + self.high) / 2]
        self.sigmas = [max(s, floor) for s in sigmas] + [width]

    def sample(self, rng: random.Random) -> float:
        i = rng.randrange(len(self.mus))
        for _ in range(16):
            x = rng.gauss(self.mus[i], self.sigmas[i])
            if self.low <= x <= self.high:
                return x
        return min(max(self.mus[i], self.low), self.high)

    def log_pdf(self, x: float) -> float:
        total = 0.0
        for mu, sigma in zip(self.mus, self.sigmas, strict=True):
            mass = _cdf((self.high - mu) / sigma) - _cdf((self.low - mu) / sigma)
            total += math.exp(-0.5 * ((x - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi) * max(mass, 1e-12))
        return math.log(max(total / len(self.mus), 1e-300))


def _cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


class _Categorical:
    """A list's values: each observed value counts one, and a uniform prior one in all."""

    def __init__(self, picks: Sequence[int], k: int) -> None:
        counts = [1.0 / k] * k
        for i in picks:
            counts[i] += 1.0
        total = sum(counts)
        self.p = [c / total for c in counts]

    def sample(self, rng: random.Random) -> int:
        return rng.choices(range(len(self.p)), weights=self.p)[0]

    def log_pdf(self, i: int) -> float:
        return math.log(self.p[i])


def _index(values: tuple[Any, ...], value: Any) -> int | None:
    for i, v in enumerate(values):
        if v == value and type(v) is type(value):
            return i
    return None


def split(observations: Sequence[Observation]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(good, bad): the best ``GAMMA`` of the observations by value (at least one, at most ``MAX_GOOD``), and the
    rest, with every observation without a value."""
    valued = sorted(((s, v) for s, v in observations if v is not None), key=lambda o: o[1])
    n_good = min(len(valued), MAX_GOOD, max(1, math.ceil(GAMMA * len(observations))))
    good = [s for s, _v in valued[:n_good]]
    bad = [s for s, _v in valued[n_good:]] + [s for s, v in observations if v is None]
    return good, bad


def propose(
    space: Mapping[str, Distribution], observations: Sequence[Observation], rng: random.Random
) -> dict[str, Any]:
    """The next settings: a random draw while no ended job has a value, else TPE's best candidate."""
    good, bad = split(observations)
    if not good:
        return {key: dist.draw(rng) for key, dist in space.items()}
    models: dict[str, tuple[Any, Any, Any]] = {}
    for key, dist in space.items():
        if dist.values:
            picks = [[i for s in group if (i := _index(dist.values, s.get(key))) is not None] for group in (good, bad)]
            models[key] = (None, _Categorical(picks[0], len(dist.values)), _Categorical(picks[1], len(dist.values)))
        else:
            numeric = _Numeric.of(dist)
            points = [[numeric.scale(s[key]) for s in group if _in_range(s.get(key), dist)] for group in (good, bad)]
            models[key] = (numeric, _Parzen(points[0], numeric), _Parzen(points[1], numeric))
    best: tuple[float, dict[str, Any]] | None = None
    for _ in range(CANDIDATES):
        candidate: dict[str, Any] = {}
        score = 0.0
        for key, (numeric, l_model, g_model) in models.items():
            x = l_model.sample(rng)
            score += l_model.log_pdf(x) - g_model.log_pdf(x)
            candidate[key] = space[key].values[x] if numeric is None else numeric.unscale(x, space[key])
        if best is None or score > best[0]:
            best = (score, candidate)
    assert best is not None
    return best[1]


def _in_range(value: Any, dist: Distribution) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return dist.low <= value <= dist.high and (dist.kind != "log_uniform" or value > 0)


# -- the scheduler's step ------------------------------------------------------------------------------------------


def propose_due(
    *, db: Session, max_unfinished: int = jobs_svc.MAX_UNFINISHED, fit: FitSettings = FitSettings()
) -> list[int]:
    """Submit the jobs the open adaptive sweeps are due (at the end of each cycle, in its transaction): for each, as
    many as keep ``at_once`` of its jobs unfinished, up to its count. Its jobs are submitted as its submitter, with
    the permissions it has now; a proposal that cannot be submitted (the user left the team, the spec no longer
    validates) closes the search and says why. Returns the new jobs' ids.

    Each sweep's row is locked, and one locked elsewhere is left to the next cycle (``SKIP LOCKED``): a cancel of
    the sweep (which closes it first) then sees the jobs proposed here, or this cycle sees it closed; and the cycle
    never waits on a sweep that a job's end holds (the end locks the job, then its sweep). Nor on a team's row that
    a submission holds (it may wait for a job row this cycle locked): that sweep too is left to the next cycle.
    ``max_unfinished``: a proposal that would bring the team past that many unfinished jobs is refused like any
    submission (KILN_MAX_UNFINISHED_JOBS_PER_TEAM), and closes the search, saying so."""
    new: list[int] = []
    open_searches = (
        select(Sweep)
        .where(Sweep.search.is_not(None), Sweep.closed_at.is_(None))
        .order_by(Sweep.id)
        .with_for_update(skip_locked=True)
    )
    for sweep in db.scalars(open_searches):
        section = sweeps.section_of(sweep)
        jobs = list(jobs_repo.of_sweep(db, sweep.id))
        to_come = sweep.jobs_to_come(len(jobs))
        if to_come == 0:
            sweeps.close(db, sweep, f"all {len(jobs)} jobs submitted")
            continue
        unfinished = sum(1 for j in jobs if JobState(j.state) not in TERMINAL)
        due = min(to_come, section.at_once() - unfinished)
        if due <= 0:
            continue
        if not teams_repo.lock_for_submissions(db, sweep.team_id, wait=False):
            continue
        try:
            new += _submit_proposals(db, sweep, section, jobs, due, max_unfinished, fit)
        except ServiceError as exc:
            sweeps.close(db, sweep, f"its next job could not be submitted: {exc}")
    return new


def _submit_proposals(
    db: Session,
    sweep: Sweep,
    section: SweepSection,
    jobs: list[Job],
    due: int,
    max_unfinished: int,
    fit: FitSettings,
) -> list[int]:
    principal = _submitter(db, sweep)
    space = space_of(section)
    objective = objective_of(sweep)
    observations = [o for j in jobs if (o := _observed(j, space, objective)) is not None]
    base = dict(jobs[0].spec)  # the sweep's first job: the document it was submitted as, with its settings
    name = sweep.name
    out: list[int] = []
    for _ in range(due):
        n = len(jobs) + len(out)
        rng = random.Random(f"{section.seed}:{n}")  # the same ended jobs propose the same settings again
        settings = propose(space, observations, rng)
        try:
            spec = parse_spec_data(expand(base, settings, f"{name}-{n}"))
        except SpecError as exc:
            raise InvalidInput.at("sweep", f"proposed {settings}: {exc}") from None
        view = jobs_svc.submit(
            db=db, principal=principal, spec=spec, sweep_id=sweep.id, max_unfinished=max_unfinished, fit=fit
        )
        out.append(view.id)
        observations.append((settings, None))  # unfinished: counted bad, as below
    return out


def _submitter(db: Session, sweep: Sweep) -> Principal:
    user = users_repo.get_by_id(db, sweep.user_id) if sweep.user_id is not None else None
    if user is None:
        raise NotFound("the user who submitted the sweep no longer exists")
    roles = users_repo.roles_of(db, user.id)
    if sweep.team_id not in roles and not user.is_admin:
        raise Forbidden(f"{user.name}, who submitted the sweep, is no longer a member of its team")
    # An admin's sweep in a team it is no member of was submitted with the admin scope: its proposals need it too.
    scopes = frozenset({"read", "write", "admin"} if user.is_admin else {"read", "write"})
    return Principal(user_id=user.id, name=user.name, user_is_admin=user.is_admin, scopes=scopes, roles=roles)


def _observed(job: Job, space: Mapping[str, Distribution], objective: Objective) -> Observation | None:
    """What a job tells the search: its settings and its value (lower is better) once it succeeded; None for one
    that failed, was stopped early or is unfinished (Optuna's "constant liar": the jobs still running count as bad,
    so the jobs proposed beside them go elsewhere); nothing for one a user cancelled."""
    settings = {key: sweeps.setting(job, key) for key in space}
    if job.state == JobState.CANCELLED.value and not stopped_early(job):
        return None
    if job.state != JobState.SUCCEEDED.value:
        return settings, None
    value = value_of(job, objective)
    if value is None:
        return settings, None
    return settings, value if objective.goal == "minimize" else -value
