"""``python -m trainer.check --spec SPEC.json [--code DIR] [--hyperparameters-only]``: what ``kiln submit`` runs
before it uploads.

Loads the recipe (the team's own module from DIR when the spec has ``code``), reads the hyperparameters, builds
the model, draws the first batch and runs one forward and backward step on the CPU, eagerly (``kiln submit
--check``). With ``--hyperparameters-only`` it stops once the module is loaded and its hyperparameters are read
(what ``kiln submit --workdir`` does by default: seconds, whatever the model's size). Prints one line:
``check: ok ...`` (exit 0), or the user's own error line as the trainer would report it (exit 2).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
from typing import TYPE_CHECKING

from core.trainer_protocol import ENV_CODE_DIR, ExitCode

if TYPE_CHECKING:
    from core.spec import JobSpec
    from trainer.recipes import Recipe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.check", description=__doc__)
    parser.add_argument(
        "--spec",
        required=True,
        type=pathlib.Path,
        action="append",
        help="a job's spec; repeated for a sweep's jobs: each one's hyperparameters are read, the "
        "first one's model run",
    )
    parser.add_argument("--code", type=pathlib.Path, help="the directory --workdir uploads")
    parser.add_argument("--hyperparameters-only", action="store_true", help="load the recipe and read its settings")
    args = parser.parse_args(argv)

    from core.spec import SpecError, parse_spec_text

    try:
        specs = [parse_spec_text(path.read_text()) for path in args.spec]
    except (OSError, SpecError) as exc:
        print(f"check: bad spec: {exc}")
        return int(ExitCode.USER_ERROR)
    if specs[0].command is not None:  # script mode: kiln cannot run one step of a script without running the script
        print("check: ok - the spec is valid; script mode (command:) runs no model check: try your script locally")
        return int(ExitCode.SUCCEEDED)
    if args.code is not None:
        os.environ[ENV_CODE_DIR] = str(args.code.resolve())

    from trainer.user_error import UserError

    try:
        with tempfile.TemporaryDirectory(prefix="kiln-check-") as run_dir:
            recipes = _recipes(specs, pathlib.Path(run_dir))
            if args.hyperparameters_only:
                jobs = f", {len(specs)} jobs" if len(specs) > 1 else ""
                print(f"check: ok - hyperparameters valid for {recipes[0].name!r}{jobs} (--check runs the model too)")
                return 0
            said = _one_step(recipes[0], specs[0].seed)
    except UserError as exc:
        print(f"check: {exc.line}")
        return int(ExitCode.USER_ERROR)
    print(f"check: ok - {said} (CPU, eager)")
    return 0


def _recipes(specs: list[JobSpec], run_dir: pathlib.Path) -> list[Recipe]:
    """Each spec's recipe, its hyperparameters read; a mistake in a sweep's later job (whose settings differ from
    the first's) says which job it is."""
    from trainer.user_error import UserError

    recipes = []
    for i, spec in enumerate(specs):
        try:
            recipes.append(_recipe(spec, run_dir))
        except UserError as exc:
            exc.line = f"job {i + 1} of the sweep's {len(specs)}: {exc.line}" if i else exc.line
            raise
    return recipes


def _recipe(spec: JobSpec, run_dir: pathlib.Path) -> Recipe:
    """The spec's recipe, its hyperparameters read (for the team's own code, by its module's ``Hyperparameters``)."""
    from trainer.config import TrainerConfig
    from trainer.recipes import load_recipe
    from trainer.user_error import user_code
    from trainer.user_recipe import UserRecipe

    with user_code("reading the hyperparameters"):
        TrainerConfig.from_spec(spec)
    assert spec.recipe is not None  # TrainerConfig.from_spec refused a script's spec
    if spec.code is not None:
        return UserRecipe(spec, run_dir)
    with user_code(f"loading recipe {spec.recipe.name!r}"):
        return load_recipe(spec.recipe.name, spec.recipe.hyperparameters)


def _one_step(recipe: Recipe, seed: int) -> str:
    """One eager forward and backward step on the CPU; what it built and the first loss, in words."""
    import torch

    from trainer.user_error import user_code

    torch.manual_seed(seed)
    with user_code("building the model"):
        model = recipe.build_model()
    with user_code("building the data"):
        batch = recipe.make_data(rank=0, world_size=1, seed=seed).batch(0)
    with user_code("one forward and backward step"):
        loss = recipe.loss(model, recipe.batch_to(batch, torch.device("cpu")))
        loss.backward()
        value = float(loss.detach())
    params = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} with {params} parameters, first loss {value:.4f}"


if __name__ == "__main__":
    sys.exit(main())
