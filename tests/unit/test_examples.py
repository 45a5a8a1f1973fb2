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


SWEEPS = sorted((Path(__file__).resolve().parents[2] / "examples").glob("**/sweep*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_sweep_example_expands(path: Path) -> None:
    import yaml

    from core.sweeps.spec import parse

    section, specs, _ = parse(yaml.safe_load(path.read_text()))
    assert specs and all(spec.team == "default" for spec in specs)
    assert section.seed is not None or not section.random  # a shipped random sweep draws the same jobs every time
