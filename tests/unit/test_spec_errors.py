"""Spec errors as a user reads them: the field, the value it got, the name probably meant, rules in words."""

from __future__ import annotations

import pytest

from core.spec import NAME_RULE, SpecError, parse_spec_text

HEAD = "name: demo\nteam: default\nrecipe: {name: gpt}\n"


def errors(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text)
    return {e["loc"]: e["msg"] for e in info.value.errors}


@pytest.mark.parametrize(
    ("text", "loc", "expected"),
    [
        (HEAD + "resourcs: {gpus: 1}\n", "resourcs", "unknown field 'resourcs'; did you mean 'resources'?"),
        (HEAD + "resources: {gpu_typ: H200}\n", "resources.gpu_typ", "did you mean 'gpu_type'? (fields here: gpus,"),
        (HEAD + "checkpointing: {every_step: 5}\n", "checkpointing.every_step", "did you mean 'every_steps'?"),
        (HEAD + "precision: bf61\n", "precision", "got 'bf61'; did you mean 'bf16'?"),
        (HEAD + "resources: {gpus: -1}\n", "resources.gpus", "greater than or equal to 0, got -1"),
        (
            HEAD + "compile: {mode: off}\n",
            "compile.mode",
            "got the boolean false: YAML reads unquoted off, no, on and yes as booleans: quote the word (mode: 'off')",
        ),
        (HEAD + "parallelism: no\n", "parallelism", "got the boolean false: YAML reads unquoted off"),
        ("name: My_Job\nteam: default\nrecipe: {name: gpt}\n", "name", f"'My_Job' is not a valid name: {NAME_RULE}"),
        (
            HEAD + "compile: {mode: 'off', cuda_graphs: true}\n",
            "compile",
            "cuda_graphs replays the compiled graph: it needs a compile mode other than off",
        ),
    ],
)
def test_errors_name_the_field_the_value_and_the_likely_intent(text: str, loc: str, expected: str) -> None:
    found = errors(text)
    assert loc in found, found
    assert expected in found[loc]


def test_the_name_rule_is_said_in_words_not_as_a_pattern() -> None:
    msg = errors("name: -bad-\nteam: default\nrecipe: {name: gpt}\n")["name"]
    assert "^[a-z0-9]" not in msg and "lowercase letters, digits" in msg
