"""kiln's measured history of a recipe, as ``core.estimate`` reads it: each finished attempt's steady step times, its
start-up and its measured peak memory, with the shape it trained and how it ran (``Shape``, ``Config``).

Nothing is stored for this: it is read from the attempts, their step telemetry and events at each estimate, so every
run that finishes is part of the next estimate (its steady steps: ``core.repositories.estimates.steady_steps``).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from core.estimate import SINGLE, Config, Run, Shape
from core.recipes import TrainingHyperparameters
from core.repositories import estimates as repo
from core.spec import JobSpec, check_recipe

# kiln's own training settings that do not change a step's work (the optimiser, its schedule, the guards' cadence):
# left out of a shape's key so that a sweep over them is one shape. Gradient accumulation does change it.
NOT_SHAPE = frozenset(TrainingHyperparameters.model_fields) - {"grad_accum"}
UNSAID = {("dropout", 0.0), ("grad_accum", 1)}  # defaults a shape's label leaves out


def resolved_precision(spec: JobSpec) -> str:
    """``auto`` is bf16 on a GPU (kiln's GPUs all do bf16) and fp32 on the CPU, as the trainer resolves it."""
    if spec.precision != "auto":
        return spec.precision
    return "bf16" if spec.resources.gpus else "fp32"


def shape_of(spec: JobSpec, hp: TrainingHyperparameters | None) -> Shape:
    """The shape of a spec's work: for a built-in recipe its model and per-rank batch (and FLOPs a rank does per
    step), for a team's code or a script the hyperparameters or command as written (no FLOPs: kiln cannot count
    them before the code runs)."""
    recipe = spec.recipe_name
    if hp is not None:
        shape = hp.shape()
        fields = {**vars(shape), "grad_accum": hp.grad_accum}
        key = " ".join(f"{k}={v}" for k, v in fields.items())
        flops = shape.flops_per_item() * shape.items_per_batch() * hp.grad_accum
        label = " ".join(f"{k}={v}" for k, v in fields.items() if (k, v) not in UNSAID)
        return Shape(recipe, key, flops, f"{recipe} ({label})")
    if spec.command is not None:
        return Shape(recipe, " ".join(spec.command), None, f"script {' '.join(spec.command)}")
    assert spec.recipe is not None
    own = {k: v for k, v in sorted(spec.recipe.hyperparameters.items()) if k not in NOT_SHAPE}
    entry = spec.code.entry_point if spec.code is not None else None
    key = f"{entry}: " + " ".join(f"{k}={v}" for k, v in own.items())
    return Shape(recipe, key, None, f"{recipe} ({key})")


def config_of(spec: JobSpec, device: str, *, strategy: str | None, fell_back: bool) -> Config:
    """How a stored job ran: its device and size from its spec, its parallelism as the trainer resolved it (one
    process: ``single``), compiled unless the spec said off or its compile fell back to eager."""
    r = spec.resources
    count = r.gpus if r.gpus else r.cpu_slots
    parallelism = SINGLE if count == 1 else strategy or (spec.parallelism if spec.parallelism != "auto" else "ddp")
    compiled = spec.compile.mode != "off" and not fell_back
    return Config(device, count, parallelism, compiled, resolved_precision(spec), r.gpu_share is not None)


def history(db: Session, *, recipe: str | None, team_id: int | None) -> list[Run]:
    """The measured runs of ``recipe`` (None: of scripts), of ``team_id`` only where given, newest first."""
    attempts = repo.measured_attempts(db, recipe=recipe, team_id=team_id)
    if not attempts:
        return []
    steps = repo.steady_steps(db, [a.attempt_id for a in attempts])
    strategy, fell_back = repo.run_events(db, sorted({a.job_id for a in attempts}))
    runs = []
    for a in attempts:
        spec = _spec(a.spec)
        rows = steps.get(a.attempt_id) or []
        times = [t for t, _ in rows]
        if spec is None or not times:
            continue
        device = "cpu" if not spec.resources.gpus else a.gpu_type or spec.resources.gpu_type or "*"
        config = config_of(spec, device, strategy=strategy.get(a.job_id), fell_back=(a.job_id, a.number) in fell_back)
        startup = (a.first_step_at - a.started_at).total_seconds() if a.started_at is not None else None
        peaks = [p for _, p in rows if p is not None]
        runs.append(
            Run(shape_of(spec, _hyperparameters(spec)), config, tuple(times), startup, max(peaks) if peaks else None)
        )
    return runs


def _spec(data: dict[str, Any]) -> JobSpec | None:
    """A stored spec as today's schema reads it; None for one it no longer accepts (a field since renamed)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError:
        return None


def _hyperparameters(spec: JobSpec) -> TrainingHyperparameters | None:
    try:
        return check_recipe(spec)
    except ValueError:
        return None
