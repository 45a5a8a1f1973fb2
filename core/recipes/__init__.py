"""The built-in recipes' hyperparameters, typed and checked without torch.

``validate`` is called wherever a spec is accepted (the API at submit, ``kiln submit`` before it sends, the
trainer before it builds anything): an unknown recipe, an unknown or misspelt hyperparameter or a value out of
range is refused with the field's path and the closest known name. A recipe installed as a ``kiln.recipes``
entry point by another package is known by name; its hyperparameters are its own business.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from core.recipes.gpt import GPTHyperparameters
from core.recipes.mlp import MLPHyperparameters
from core.recipes.training import RecipeShape, TrainingHyperparameters

CATALOGUE: dict[str, type[TrainingHyperparameters]] = {"gpt": GPTHyperparameters, "mlp": MLPHyperparameters}
# What a built-in recipe's items_per_batch() counts: the throughput the trainer reports is these per second.
ITEMS: dict[str, str] = {"gpt": "tokens", "mlp": "samples"}

__all__ = [
    "CATALOGUE",
    "ITEMS",
    "HyperparameterError",
    "RecipeShape",
    "TrainingHyperparameters",
    "known_recipes",
    "throughput_unit",
    "validate",
]


class HyperparameterError(ValueError):
    """``errors``: [{loc, msg, type}] with locs from the spec's root, as problem+json reports them."""

    def __init__(self, errors: list[dict[str, Any]]):
        first = errors[0]
        super().__init__(f"{first['loc']}: {first['msg']}")
        self.errors = errors


def throughput_unit(spec: Mapping[str, Any]) -> str:
    """The unit of a job's throughput (the telemetry's ``tokens_per_s``): a built-in recipe's items per second
    (the GPT's tokens, the MLP's samples); a team's own code counts the batch's leading dimension unless its
    ``items_per_batch()`` says otherwise, so samples; a script without a recipe reports its own items."""
    recipe = spec.get("recipe") or {}
    if spec.get("command") or not recipe:
        return "items/s"
    if spec.get("code"):
        return "samples/s"
    return f"{ITEMS.get(str(recipe.get('name')), 'items')}/s"


def known_recipes() -> list[str]:
    return sorted(set(CATALOGUE) | {ep.name for ep in entry_points(group="kiln.recipes")})


def _closest(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def validate(name: str, hyperparameters: Mapping[str, Any]) -> TrainingHyperparameters | None:
    """The typed hyperparameters of a built-in recipe (None for another installed recipe); raises
    HyperparameterError."""
    model = CATALOGUE.get(name)
    if model is None:
        known = known_recipes()
        if name in known:
            return None
        raise HyperparameterError(
            [
                {
                    "loc": "recipe.name",
                    "type": "unknown_recipe",
                    "msg": f"unknown recipe {name!r}{_closest(name, known)} (known: {', '.join(known)})",
                }
            ]
        )
    try:  # fault injection is no hyperparameter either: a spec naming a test hook is refused as unknown
        return model.model_validate(dict(hyperparameters))
    except ValidationError as exc:
        raise HyperparameterError(_errors(exc, list(model.model_fields))) from None


def _errors(exc: ValidationError, fields: list[str]) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        path = [str(p) for p in err["loc"]]
        loc = ".".join(["recipe", "hyperparameters", *path])
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and path:
            msg = f"unknown hyperparameter {path[0]!r}{_closest(path[0], fields)}"
        elif err["type"] == "literal_error" and path:
            msg = f"{msg} (got {err.get('input')!r})"
        out.append({"loc": loc, "msg": msg, "type": err["type"]})
    return out
