"""Every example under examples/ is a valid job spec (the documentation cannot drift from the schema)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.spec import SpecError, parse_spec_text

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.*"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses(path: Path) -> None:
    spec = parse_spec_text(path.read_text())
    assert spec.name and spec.team == "default"


def test_unknown_field_is_rejected_with_its_path() -> None:
    text = (EXAMPLES[0]).read_text() + "\nresources_typo: 1\n"
    with pytest.raises(SpecError) as err:
        parse_spec_text(text)
    assert err.value.errors[0]["loc"] == "resources_typo"
    nested = "name: a\nteam: b\nrecipe: {name: gpt}\nresources: {gpus: 1, gpu_kind: H200}\n"
    with pytest.raises(SpecError) as err:
        parse_spec_text(nested)
    assert err.value.errors[0]["loc"] == "resources.gpu_kind"
