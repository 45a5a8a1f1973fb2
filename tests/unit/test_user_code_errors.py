"""A mistake in a team's own code is the team's: the trainer exits 2 (USER_ERROR: the job fails without a restart)
with the user's own exception line and their file and line, none of kiln's frames. Covers the recipe protocol's
checks too (missing functions, wrong protocol version, bad hyperparameters), and a run that works."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import pytest
import torch

from core.spec import parse_spec_data
from core.trainer_protocol import ENV_CODE_DIR, ExitCode
from trainer.parallel import DistEnv
from trainer.run import run

GOOD = """
KILN_PROTOCOL = 1
import torch
from pydantic import BaseModel

class Hyperparameters(BaseModel):
    width: int = 4

def build_model(hp):
    return torch.nn.Linear(hp.width, 2)

def batches(hp, *, rank, world_size, seed, start):
    i = start
    while True:
        g = torch.Generator().manual_seed(seed * 1000 + i)
        yield torch.randn(8, hp.width, generator=g), torch.randint(0, 2, (8,), generator=g)
        i += 1

def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)

def evaluate(model, hp, *, rank, world_size):
    return {"bias_norm": float(model.bias.norm())}
"""

_names = itertools.count()


def run_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, **hp: object) -> tuple[int, str | None]:
    """Train the module ``source`` for 4 steps; the exit code and the EXIT record's error line."""
    name = f"user_mod_{next(_names)}"  # a fresh module name per case: the import system caches modules
    code = tmp_path / "code"
    code.mkdir()
    (code / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.setenv(ENV_CODE_DIR, str(code))
    spec = parse_spec_data(
        {
            "name": "mine",
            "team": "t",
            "recipe": {"name": "mine", "hyperparameters": hp},
            "steps": 4,
            "code": {"entry_point": name, "digest": "0" * 64},
            "compile": {"mode": "off"},
            "precision": "fp32",
            "checkpointing": {"every_steps": 2, "asynchronous": False},
        }
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    rc = run(spec, tmp_path / "run", env)
    records = [json.loads(line) for line in (tmp_path / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()]
    return int(rc), records[-1]["fields"]["error"]


def test_working_code_trains_and_evaluates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rc, error = run_code(tmp_path, monkeypatch, GOOD, lr=0.01, width=6)
    assert (rc, error) == (0, None)
    lines = (tmp_path / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()
    evals = [json.loads(x) for x in lines if '"kind":"eval"' in x]
    assert [e["step"] for e in evals] == [2, 4] and "bias_norm" in evals[-1]["metrics"]


CASES = {
    "syntax error": (GOOD + "\ndef broken(:\n", {}, "importing your code", "SyntaxError"),
    "import error": ("import no_such_package_kiln\n" + GOOD, {}, "importing your code", "ModuleNotFoundError"),
    "no protocol": (GOOD.replace("KILN_PROTOCOL = 1", ""), {}, "importing your code", "KILN_PROTOCOL = None"),
    "missing loss": (GOOD.replace("def loss(", "def not_loss("), {}, "importing your code", "has no loss"),
    "unknown hyperparameter": (
        GOOD,
        {"widht": 3},
        "reading the hyperparameters",
        "recipe.hyperparameters.widht: unknown hyperparameter; did you mean 'width'?",
    ),
    "bad hyperparameter type": (
        GOOD,
        {"width": "wide"},
        "reading the hyperparameters",
        "recipe.hyperparameters.width: Input should be a valid integer",
    ),
    "build_model raises": (
        GOOD.replace("return torch.nn.Linear(hp.width, 2)", "raise ValueError('no such layer size')"),
        {},
        "your build_model(): ValueError: no such layer size",
        "raise ValueError",
    ),
    "batches raise mid-run": (
        GOOD.replace("        i += 1", "        i += 1\n        if i == 3: raise KeyError('shard 3')"),
        {},
        "your batches(): KeyError: 'shard 3'",
        "raise KeyError",
    ),
    "loss shape mismatch": (
        GOOD.replace("return torch.nn.functional.cross_entropy(model(x), y)", "return model(x[:, :1]).sum()"),
        {},
        "your loss(): RuntimeError",
        "x[:, :1]",
    ),
    "evaluate raises": (
        GOOD.replace('return {"bias_norm"', 'return 1 / 0 or {"bias_norm"'),
        {},
        "your evaluate(): ZeroDivisionError",
        "1 / 0",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_in_the_code_is_a_user_error_with_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    source, hp, what, marker = CASES[case]
    rc, error = run_code(tmp_path, monkeypatch, source, **hp)
    assert rc == ExitCode.USER_ERROR, error
    assert error is not None and what in error, error
    lines = textwrap.dedent(source).splitlines()
    at = [i + 1 for i, line in enumerate(lines) if marker in line]
    if at:  # a failure inside the user's own function names their file and line
        assert error.endswith(f".py:{at[0]})"), error
    else:
        assert marker in error, error
    assert "trainer/" not in error and "site-packages" not in error
