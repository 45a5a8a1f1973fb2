"""A sweep document parsed and expanded, with no database: the ``sweep`` section's model, its random
distributions and early-stopping rule, and the job specs it expands into. The API's sweep service
(``core.sweeps.service``) submits what this parses; ``kiln sweep submit`` parses with it to upload the jobs' code
before the API sees the document.

A sweep document is a job spec with a ``sweep`` section::

    sweep:
      grid: {lr: [0.001, 0.003], batch_size: [8, 16]}   # every combination: 4 jobs
      list: [{lr: 0.01}, {lr: 0.03, steps: 200}]         # or these settings, one job each
      random: {lr: {log_uniform: [1e-4, 1e-2]}, channels: [8, 16, 32]}   # or count random draws
      count: 8
      seed: 3                                             # the draws' seed (drawn and stored when left out)
      max_concurrent: 2                                   # at most 2 of its jobs run at once (Slurm's %N)
      objective: {metric: accuracy, goal: maximize}       # what ranks its jobs (default: the final loss, lowest)
      early_stopping: {rule: median, min_jobs: 3}         # stop a job worse than the others' median at a step
                                                          # (or {rule: successive_halving, min_steps: 100})
      search: tpe                                         # with random and count: start with ``initial`` random
      initial: 4                                          # draws, then propose each next job from the jobs
                                                          # that ended (``core.sweeps.search``)

A key names a field of the spec (``steps``, ``resources.gpus``: a dotted path) or else a hyperparameter of the
recipe (``lr`` is ``recipe.hyperparameters.lr``). Job ``i`` is named ``<name>-<i>``. The scheduler holds back
jobs beyond ``max_concurrent`` with the pending reason ``SweepLimit``. A random key is a list (one of its values,
each as likely) or one of ``uniform``, ``log_uniform`` (a float, uniform in its logarithm: learning rates) and
``int_uniform`` (an integer, both ends included) over ``[low, high]``; floats are kept to 4 significant digits.
Ranking by the objective: ``core.sweeps.ranking``; early stopping: ``core.sweeps.stopping``.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
import secrets
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from core.services.errors import InvalidInput
from core.spec import JobSpec, SpecError, StrictModel, parse_spec_data, validation_errors
from core.sweeps.ranking import LOSS, Objective

MAX_JOBS = 256
# The sweep's job specs together, as JSON, at most: each job is a copy of the document, expanded and validated
# before anything else is checked, so a large document over many points costs seconds of CPU. A spec of 16 KiB
# 256 times; kiln's examples are under 1 KiB.
MAX_EXPANDED_BYTES = 4 * 2**20


DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform")


@dataclass(frozen=True)
class Distribution:
    """One random key: ``values`` (one of them, each as likely) or ``kind`` over ``[low, high]``."""

    values: tuple[Any, ...] = ()
    kind: str = ""
    low: float = 0.0
    high: float = 0.0

    @classmethod
    def parse(cls, key: str, raw: Any) -> Distribution:
        loc, usage = f"sweep.random.{key}", "a list of values, or {uniform|log_uniform|int_uniform: [low, high]}"
        if isinstance(raw, list):
            if not raw:
                raise InvalidInput.at(loc, "no values")
            return cls(values=tuple(raw))
        if not (isinstance(raw, dict) and len(raw) == 1 and next(iter(raw)) in DISTRIBUTIONS):
            raise InvalidInput.at(loc, f"expected {usage}")
        kind, ends = next(iter(raw.items()))
        numbers = (
            isinstance(ends, list)
            and len(ends) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in ends)
        )
        if not numbers or (kind == "int_uniform" and not all(isinstance(x, int) for x in ends)):
            what = "integers" if kind == "int_uniform" else "numbers"
            raise InvalidInput.at(f"{loc}.{kind}", f"expected [low, high], two {what}")
        low, high = ends
        if low > high:
            raise InvalidInput.at(f"{loc}.{kind}", f"the low end {low} is above the high end {high}")
        if kind == "log_uniform" and low <= 0:
            raise InvalidInput.at(f"{loc}.{kind}", "a log-uniform range is above 0")
        return cls(kind=kind, low=low, high=high)

    def draw(self, rng: random.Random) -> Any:
        if self.values:
            return rng.choice(self.values)
        if self.kind == "int_uniform":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "log_uniform":
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            x = rng.uniform(self.low, self.high)
        return self.kept(x)

    def kept(self, x: float) -> float:
        """A number drawn or proposed as the sweep keeps it: 4 significant digits, never outside the range."""
        return min(max(float(f"{x:.4g}"), self.low), self.high)


class EarlyStopping(StrictModel):
    """When a sweep stops its hopeless jobs (``core.sweeps.stopping``), judged on its objective at the
    jobs' evaluations by one of two rules:

    * ``median`` (the default): a job whose value at a step after ``after_steps`` is worse than the median of at
      least ``min_jobs`` other jobs' values at that step stops;
    * ``successive_halving`` (asynchronous successive halving, ASHA): at rungs of ``min_steps`` times powers of
      ``reduction_factor`` steps, a job goes on only while its value is among the best ``1 / reduction_factor`` of
      the values the sweep's jobs had at that rung (judged once there, against at least ``min_jobs`` others).
    """

    rule: Literal["median", "successive_halving"] = "median"
    min_jobs: Annotated[int, Field(ge=1, le=MAX_JOBS)] = 3
    after_steps: Annotated[int, Field(ge=0)] = 0
    min_steps: Annotated[int | None, Field(ge=1)] = None
    reduction_factor: Annotated[int, Field(ge=2, le=16)] = 3

    @model_validator(mode="after")
    def _fields_of_its_rule(self) -> EarlyStopping:
        given = self.model_fields_set
        if self.rule == "median" and given & {"min_steps", "reduction_factor"}:
            raise ValueError("min_steps and reduction_factor are successive_halving's (rule: successive_halving)")
        if self.rule == "successive_halving":
            if "after_steps" in given:
                raise ValueError("after_steps is the median rule's; successive_halving's first rung is min_steps")
            if self.min_steps is None:
                raise ValueError("successive_halving needs min_steps: its first rung, in steps")
        return self

    def described(self) -> str:
        """The rule in words (the API's ``early_stopping``, ``kiln sweep show``, the dashboard's sweep page)."""
        if self.rule == "successive_halving":
            assert self.min_steps is not None
            f, first = self.reduction_factor, self.min_steps
            return (
                f"successive halving: at {first}, {first * f}, {first * f * f}, ... steps a job goes on only "
                f"while among the best 1/{f} of the sweep's jobs there (judged against at least "
                f"{self.min_jobs} others)"
            )
        after = f" after step {self.after_steps}" if self.after_steps else ""
        return (
            f"the median rule: a job worse than the median of at least {self.min_jobs} other jobs at a "
            f"step{after} stops"
        )

    def rung(self, step: int) -> tuple[int, int] | None:
        """Successive halving's rung that ``step`` is in, as ``[start, next rung's start)``; None before the first."""
        assert self.min_steps is not None
        if step < self.min_steps:
            return None
        start = self.min_steps
        while start * self.reduction_factor <= step:
            start *= self.reduction_factor
        return start, start * self.reduction_factor


class SweepSection(StrictModel):
    grid: Annotated[dict[str, list[Any]], Field(max_length=16)] = Field(default_factory=dict)
    list_: Annotated[list[dict[str, Any]], Field(alias="list", max_length=MAX_JOBS)] = Field(default_factory=list)
    random: Annotated[dict[str, Any], Field(max_length=16)] = Field(default_factory=dict)
    count: Annotated[int | None, Field(ge=1, le=MAX_JOBS)] = None
    seed: Annotated[int | None, Field(ge=0, lt=2**63)] = None
    max_concurrent: Annotated[int | None, Field(ge=1, le=MAX_JOBS)] = None
    objective: Objective = Objective()
    early_stopping: EarlyStopping | None = None
    search: Literal["tpe"] | None = None
    initial: Annotated[int | None, Field(ge=1, le=MAX_JOBS)] = None

    @model_validator(mode="after")
    def _search_needs_random_draws(self) -> SweepSection:
        if self.search is None:
            if self.initial is not None:
                raise ValueError("initial is an adaptive search's first random draws (search: tpe)")
            return self
        if not self.random or self.count is None:
            raise ValueError("search: tpe searches the space of a random section, up to count jobs: give both")
        if self.initial is not None and self.initial > self.count:
            raise ValueError(f"initial ({self.initial}) is more than count ({self.count})")
        return self

    def first_draws(self) -> int:
        """How many random draws the sweep starts with: all ``count`` of them, or an adaptive search's ``initial``
        (by default a quarter of its count, 2 to 10)."""
        assert self.count is not None
        if self.search is None:
            return self.count
        return self.initial if self.initial is not None else min(self.count, 10, max(2, self.count // 4))

    def at_once(self) -> int:
        """How many of an adaptive search's jobs are unfinished at a time: ``max_concurrent``, else ``initial``."""
        return self.max_concurrent if self.max_concurrent is not None else self.first_draws()

    def described_search(self) -> str | None:
        """An adaptive search in words (the API's ``search``, ``kiln sweep show``, the dashboard); None without."""
        if self.search is None:
            return None
        return (
            f"TPE (tree-structured Parzen estimators): {self.first_draws()} random draws, then each next "
            f"job's settings proposed from the jobs that ended, {self.at_once()} at a time, {self.count} jobs "
            "in all"
        )


def with_seed(section: SweepSection) -> SweepSection:
    """A random sweep's section with its seed: the one given, or one drawn now (stored, so the draws can be
    repeated by submitting the stored section again)."""
    if not section.random or section.seed is not None:
        return section
    return section.model_copy(update={"seed": secrets.randbelow(2**31)})


def settings_of(section: SweepSection) -> list[dict[str, Any]]:
    """One dict of settings per job: the grid's product, the list as given, or ``count`` random draws."""
    if sum(map(bool, (section.grid, section.list_, section.random))) > 1:
        raise InvalidInput.at("sweep", "give one of a grid, a list or random draws, not several")
    if section.random:
        if section.count is None:
            raise InvalidInput.at("sweep.count", f"random draws need a count: how many jobs (1..{MAX_JOBS})")
        dists = space_of(section)
        rng = random.Random(section.seed)
        return [{key: dist.draw(rng) for key, dist in dists.items()} for _ in range(section.first_draws())]
    if section.count is not None or section.seed is not None:
        loc = "sweep.count" if section.count is not None else "sweep.seed"
        raise InvalidInput.at(loc, "only random draws take a count and a seed")
    if section.list_:
        return [dict(point) for point in section.list_]
    if not section.grid:
        raise InvalidInput.at("sweep", "a sweep needs a grid (every combination), a list of settings or random draws")
    for key, values in section.grid.items():
        if not values:
            raise InvalidInput.at(f"sweep.grid.{key}", "no values")
    count = math.prod(len(v) for v in section.grid.values())
    if count > MAX_JOBS:
        raise InvalidInput.at("sweep.grid", f"{count} combinations; at most {MAX_JOBS} jobs per sweep")
    keys = list(section.grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*section.grid.values())]


def key_path(key: str) -> list[str]:
    if "." in key or key in JobSpec.model_fields:
        return key.split(".")
    return ["recipe", "hyperparameters", key]


def expand(base: dict[str, Any], settings: dict[str, Any], name: str) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for key, value in settings.items():
        *parents, leaf = key_path(key)
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InvalidInput.at(f"sweep.{key}", f"{part!r} is not a section of the spec")
            node = child
        node[leaf] = value
    data["name"] = name
    return data


def parse(document: dict[str, Any]) -> tuple[SweepSection, list[JobSpec], dict[str, Any]]:
    """(the sweep section, each job's validated spec, the base spec) from a sweep document."""
    base = dict(document)
    raw = base.pop("sweep", None)
    if not isinstance(raw, dict):
        raise InvalidInput.at(
            "sweep", "a sweep document is a job spec with a sweep section (a grid, a list or random draws)"
        )
    try:
        section = SweepSection.model_validate(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": "sweep" if e["loc"] == "$" else f"sweep.{e['loc']}"} for e in validation_errors(exc)]
        raise SpecError(f"invalid sweep: {errors[0]['loc']}: {errors[0]['msg']}", errors) from exc
    section = with_seed(section)
    if section.early_stopping is not None and section.objective.metric == LOSS:
        raise InvalidInput.at(
            "sweep.early_stopping",
            "early stopping compares a metric the jobs' evaluations report: name it as the objective "
            "(objective: {metric: accuracy, goal: maximize})",
        )
    points = settings_of(section)
    size = len(json.dumps(base, separators=(",", ":"), default=str))
    if size * len(points) > MAX_EXPANDED_BYTES:
        msg = (
            f"its {len(points)} jobs would carry {size * len(points)} bytes of spec ({size} each), over "
            f"{MAX_EXPANDED_BYTES}: fewer points, or a smaller spec (large inputs belong in a dataset)"
        )
        raise SpecError(f"the sweep is too large: {msg}", [{"loc": "sweep", "msg": msg, "type": "size"}])
    name = str(base.get("name", "sweep"))[:58]
    specs = []
    for i, point in enumerate(points):
        try:
            specs.append(parse_spec_data(expand(base, point, f"{name}-{i}")))
        except SpecError as exc:
            raise SpecError(f"sweep job {i} ({point}): {exc}", exc.errors) from None
    return section, specs, base


def space_of(section: SweepSection) -> dict[str, Distribution]:
    """A random section's keys and what each is drawn from."""
    return {key: Distribution.parse(key, raw) for key, raw in section.random.items()}
