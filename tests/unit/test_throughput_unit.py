"""What a job's throughput counts per second, as the dashboard labels its chart (issue 42: "tokens/s" was shown for
an image CNN)."""

from __future__ import annotations

import pytest

from core.recipes import throughput_unit


@pytest.mark.parametrize(
    ("spec", "unit"),
    [
        ({"recipe": {"name": "gpt"}}, "tokens/s"),
        ({"recipe": {"name": "mlp"}}, "samples/s"),
        ({"recipe": {"name": "digits-cnn"}, "code": {"entry_point": "digits"}}, "samples/s"),
        ({"command": ["python", "train.py"], "code": {"digest": "ab"}}, "items/s"),
        ({"recipe": {"name": "someone-elses"}}, "items/s"),
    ],
)
def test_throughput_unit_follows_the_recipe(spec: dict[str, object], unit: str) -> None:
    assert throughput_unit(spec) == unit
