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

from core.trainer_protocol import ENV_CODE_DIR, ExitCode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.check", description=__doc__)
    parser.add_argument("--spec", required=True, type=pathlib.Path)
    parser.add_argument("--code", type=pathlib.Path, help="the directory --workdir uploads")
    parser.add_argument("--hyperparameters-only", action="store_true", help="load the recipe and read its settings")
    args = parser.parse_args(argv)

    from core.spec import SpecError, parse_spec_text

    try:
        spec = parse_spec_text(args.spec.read_text())
    except (OSError, SpecError) as exc:
        print(f"check: bad spec: {exc}")
        return int(ExitCode.USER_ERROR)
    if spec.command is not None:  # script mode: kiln cannot run one step of a script without running the script
        print("check: ok - the spec is valid; script mode (command:) runs no model check: try your script locally")
        return int(ExitCode.SUCCEEDED)
    if args.code is not None:
        os.environ[ENV_CODE_DIR] = str(args.code.resolve())

    import torch

    from trainer.config import TrainerConfig
    from trainer.recipes import Recipe, load_recipe
    from trainer.user_error import UserError, user_code
    from trainer.user_recipe import UserRecipe

    try:
        with tempfile.TemporaryDirectory(prefix="kiln-check-") as run_dir:
            with user_code("reading the hyperparameters"):
                TrainerConfig.from_spec(spec)
            recipe: Recipe
            assert spec.recipe is not None  # TrainerConfig.from_spec refused a script's spec
            if spec.code is not None:
                recipe = UserRecipe(spec, pathlib.Path(run_dir))
            else:
                with user_code(f"loading recipe {spec.recipe.name!r}"):
                    recipe = load_recipe(spec.recipe.name, spec.recipe.hyperparameters)
            if args.hyperparameters_only:
                print(f"check: ok - hyperparameters valid for {spec.recipe.name!r} (--check runs the model too)")
                return 0
            torch.manual_seed(spec.seed)
            with user_code("building the model"):
                model = recipe.build_model()
            with user_code("building the data"):
                batch = recipe.make_data(rank=0, world_size=1, seed=spec.seed).batch(0)
            with user_code("one forward and backward step"):
                loss = recipe.loss(model, recipe.batch_to(batch, torch.device("cpu")))
                loss.backward()
                value = float(loss.detach())
    except UserError as exc:
        print(f"check: {exc.line}")
        return int(ExitCode.USER_ERROR)
    params = sum(p.numel() for p in model.parameters())
    print(f"check: ok - {type(model).__name__} with {params} parameters, first loss {value:.4f} (CPU, eager)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
