"""A sweep's section: random draws (repeatable by their seed, inside their ranges, refused with the field when
malformed) and the objective that ranks its jobs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.models import Job
from core.services.errors import InvalidInput
from core.states import JobState
from core.sweeps.ranking import Objective, ranked
from core.sweeps.spec import SweepSection, settings_of, with_seed


def section(**fields: Any) -> SweepSection:
    return SweepSection.model_validate(fields)


RANDOM = {
    "lr": {"log_uniform": [1e-4, 1e-2]},
    "dropout": {"uniform": [0.0, 0.5]},
    "hidden": {"int_uniform": [32, 128]},
    "channels": [8, 16, 32],
}


def test_random_draws_are_repeatable_by_their_seed_and_inside_their_ranges() -> None:
    points = settings_of(section(random=RANDOM, count=200, seed=3))
    assert points == settings_of(section(random=RANDOM, count=200, seed=3))
    assert points != settings_of(section(random=RANDOM, count=200, seed=4))
    assert len(points) == 200 and all(set(p) == set(RANDOM) for p in points)
    assert all(1e-4 <= p["lr"] <= 1e-2 and 0.0 <= p["dropout"] <= 0.5 for p in points)
    assert all(isinstance(p["hidden"], int) and 32 <= p["hidden"] <= 128 for p in points)
    assert {p["channels"] for p in points} == {8, 16, 32}
    assert all(float(f"{p['lr']:.4g}") == p["lr"] for p in points)  # 4 significant digits
    # Log-uniform: a decade is as likely as another (about half the draws below 1e-3).
    below = sum(p["lr"] < 1e-3 for p in points) / len(points)
    assert 0.35 < below < 0.65, below
    assert min(p["hidden"] for p in points) < 40 and max(p["hidden"] for p in points) > 120


def test_a_random_sweep_without_a_seed_gets_one_and_keeps_it() -> None:
    drawn = with_seed(section(random=RANDOM, count=3))
    assert drawn.seed is not None
    assert settings_of(drawn) == settings_of(section(random=RANDOM, count=3, seed=drawn.seed))
    assert with_seed(section(random=RANDOM, count=3, seed=9)).seed == 9
    assert with_seed(section(grid={"lr": [0.1]})).seed is None


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"random": {"lr": [0.1]}}, "sweep.count"),
        ({"random": {"lr": [0.1]}, "grid": {"lr": [0.2]}, "count": 1}, "sweep"),
        ({"grid": {"lr": [0.2]}, "count": 2}, "sweep.count"),
        ({"list": [{"lr": 0.2}], "seed": 2}, "sweep.seed"),
        ({"random": {"lr": []}, "count": 1}, "sweep.random.lr"),
        ({"random": {"lr": {"normal": [0, 1]}}, "count": 1}, "sweep.random.lr"),
        ({"random": {"lr": {"uniform": [0.1, 0.2], "log_uniform": [0.1, 0.2]}}, "count": 1}, "sweep.random.lr"),
        ({"random": {"lr": {"uniform": [0.2, 0.1]}}, "count": 1}, "sweep.random.lr.uniform"),
        ({"random": {"lr": {"uniform": [0.1]}}, "count": 1}, "sweep.random.lr.uniform"),
        ({"random": {"lr": {"uniform": [0.1, "high"]}}, "count": 1}, "sweep.random.lr.uniform"),
        ({"random": {"lr": {"log_uniform": [0, 0.1]}}, "count": 1}, "sweep.random.lr.log_uniform"),
        ({"random": {"n": {"int_uniform": [1, 2.5]}}, "count": 1}, "sweep.random.n.int_uniform"),
    ],
)
def test_a_malformed_random_section_is_refused_with_its_field(fields: dict[str, Any], loc: str) -> None:
    with pytest.raises(InvalidInput) as err:
        settings_of(section(**fields))
    assert err.value.errors[0]["loc"] == loc, err.value


def job(i: int, state: JobState, loss: float | None, metrics: dict[str, Any] | None) -> Job:
    return Job(
        id=i,
        state=state.value,
        last_loss=loss,
        eval_metrics={"step": 10, "metrics": metrics} if metrics is not None else None,
    )


def test_the_objective_ranks_the_jobs_best_first() -> None:
    done, running, queued = JobState.SUCCEEDED, JobState.RUNNING, JobState.QUEUED
    jobs = [
        job(1, done, 0.30, {"accuracy": 0.91}),
        job(2, done, 0.20, {"accuracy": 0.97}),
        job(3, running, 0.10, {"accuracy": 0.99}),
        job(4, done, 0.25, None),
        job(5, queued, None, None),
        job(6, done, math.nan, {"accuracy": math.nan}),
    ]
    ids = lambda js: [j.id for j in js]  # noqa: E731
    assert ids(ranked(jobs)) == [2, 4, 1, 3, 5, 6]  # the default: final loss, lowest first
    assert ids(ranked(jobs, Objective(metric="accuracy", goal="maximize"))) == [2, 1, 3, 4, 5, 6]
    assert ids(ranked(jobs, Objective(metric="accuracy"))) == [1, 2, 3, 4, 5, 6]  # minimize, as asked
    assert "higher is better" in Objective(metric="accuracy", goal="maximize").rule()
    assert Objective().rule().startswith("succeeded jobs by final loss (lower is better)")


def test_an_objective_names_a_metric_and_a_goal() -> None:
    from pydantic import ValidationError

    for bad in ({"goal": "max"}, {"metric": ""}, {"metric": "acc uracy"}, {"metric": "x" * 65}, {"metrc": "a"}):
        with pytest.raises(ValidationError):
            Objective.model_validate(bad)
    assert Objective.model_validate({"metric": "val/accuracy", "goal": "maximize"}).metric == "val/accuracy"


def test_the_median_rule_stops_only_what_is_worse_than_enough_others() -> None:
    from core.sweeps.stopping import median_to_beat

    up, down = Objective(metric="accuracy", goal="maximize"), Objective(metric="heldout_loss")
    assert median_to_beat(0.5, [0.9, 0.8, 0.7], up, min_jobs=3) == 0.8
    assert median_to_beat(0.8, [0.9, 0.8, 0.7], up, min_jobs=3) is None  # a tie is not worse
    assert median_to_beat(0.5, [0.9, 0.8], up, min_jobs=3) is None  # too few to compare with
    assert median_to_beat(0.5, [0.9, 0.8, 0.7, 0.6], up, min_jobs=3) == 0.75
    assert median_to_beat(0.3, [0.1, 0.2, 0.25], down, min_jobs=1) == 0.2  # lower is better
    assert median_to_beat(0.15, [0.1, 0.2, 0.25], down, min_jobs=1) is None


def test_early_stopping_needs_an_evaluated_objective() -> None:
    from core.sweeps.spec import parse

    base = {"name": "s", "team": "default", "recipe": {"name": "gpt"}, "steps": 10}
    with pytest.raises(InvalidInput) as err:
        parse({**base, "sweep": {"grid": {"lr": [0.1, 0.2]}, "early_stopping": {"rule": "median"}}})
    assert err.value.errors[0]["loc"] == "sweep.early_stopping" and "objective" in str(err.value)
    section, _, _ = parse(
        {
            **base,
            "sweep": {
                "grid": {"lr": [0.1, 0.2]},
                "early_stopping": {},
                "objective": {"metric": "accuracy", "goal": "maximize"},
            },
        }
    )
    assert section.early_stopping is not None and section.early_stopping.min_jobs == 3
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        SweepSection.model_validate({"early_stopping": {"rule": "asha"}})


def test_successive_halvings_rungs_and_who_goes_on_at_one() -> None:
    from core.sweeps.spec import EarlyStopping
    from core.sweeps.stopping import rung_cutoff

    rule = EarlyStopping(rule="successive_halving", min_steps=100, reduction_factor=3)
    assert rule.described() == (
        "successive halving: at 100, 300, 900, ... steps a job goes on only while among the "
        "best 1/3 of the sweep's jobs there (judged against at least 3 others)"
    )
    assert [rule.rung(s) for s in (99, 100, 299, 300, 899, 900, 2700)] == [
        None,
        (100, 300),
        (100, 300),
        (300, 900),
        (300, 900),
        (900, 2700),
        (2700, 8100),
    ]
    up, down = Objective(metric="accuracy", goal="maximize"), Objective(metric="heldout_loss")
    # 6 values at the rung with it: the best 2 go on (6 // 3)
    assert rung_cutoff(0.85, [0.9, 0.8, 0.7, 0.6, 0.5], up, 3, min_jobs=3) is None  # 2nd best: goes on
    assert rung_cutoff(0.75, [0.9, 0.8, 0.7, 0.6, 0.5], up, 3, min_jobs=3) == (2, 0.8)  # 3rd: stops; 0.8 went on
    assert rung_cutoff(0.8, [0.9, 0.8, 0.7, 0.6, 0.5], up, 3, min_jobs=3) is None  # a tie with the 2nd is not worse
    assert rung_cutoff(0.1, [0.9, 0.8], up, 3, min_jobs=3) is None  # too few at the rung yet
    assert rung_cutoff(0.5, [0.9, 0.8, 0.7], up, 3, min_jobs=3) == (1, 0.9)  # 4 // 3 = 1: only the best
    assert rung_cutoff(0.3, [0.1, 0.2, 0.25], down, 2, min_jobs=1) == (2, 0.2)  # lower is better, halving
    assert rung_cutoff(0.15, [0.1, 0.2, 0.25], down, 2, min_jobs=1) is None


@pytest.mark.parametrize(
    ("early_stopping", "says"),
    [
        ({"rule": "successive_halving"}, "needs min_steps"),
        ({"rule": "successive_halving", "min_steps": 100, "after_steps": 50}, "after_steps is the median rule's"),
        ({"rule": "median", "min_steps": 100}, "min_steps and reduction_factor are successive_halving's"),
        ({"rule": "successive_halving", "min_steps": 100, "reduction_factor": 1}, "greater than or equal to 2"),
    ],
)
def test_an_early_stopping_rule_with_another_rules_fields_is_refused_saying_which(
    early_stopping: dict[str, Any], says: str
) -> None:
    from core.spec import SpecError
    from core.sweeps.spec import parse

    doc = {
        "name": "s",
        "team": "default",
        "recipe": {"name": "gpt"},
        "steps": 10,
        "sweep": {
            "grid": {"lr": [0.1, 0.2]},
            "early_stopping": early_stopping,
            "objective": {"metric": "accuracy", "goal": "maximize"},
        },
    }
    with pytest.raises(SpecError) as err:
        parse(doc)
    assert err.value.errors[0]["loc"].startswith("sweep.early_stopping") and says in str(err.value), err.value
