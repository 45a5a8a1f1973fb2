"""The settings tree: every field documented, the page generated from it, the policy reachable from the environment
and taken by ``kiln simulate``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.policy_config import PolicyConfig
from core.settings import Settings, get_settings
from core.settings_doc import GROUPS, PAGE, render
from scheduler.simulate.replay import main as simulate


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_the_configuration_page_is_generated_from_the_settings() -> None:
    assert PAGE.read_text() == render(), "docs/configuration.md is stale: run python -m core.settings_doc"


def test_every_setting_is_described_and_on_the_page() -> None:
    page = PAGE.read_text()
    documented = 0
    for _title, prefix, group in GROUPS:
        for name, field in group.model_fields.items():
            assert field.description, f"{group.__name__}.{name} has no description"
            assert f"`{prefix}{name.upper()}`" in page
            documented += 1
    # Every field of the tree is in some group (the policy is the one nested group).
    assert documented == len(Settings.model_fields) - 1 + len(PolicyConfig.model_fields)


def test_the_policy_comes_from_nested_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_POLICY__PREEMPTION", "false")
    monkeypatch.setenv("KILN_POLICY__PLACEMENT", "spread")
    monkeypatch.setenv("KILN_POLICY__STARVATION_AGE_S", "")  # empty: not set, i.e. no aging
    monkeypatch.setenv("KILN_RESTART_BACKOFF_CAP_S", "60")
    settings = Settings()
    assert settings.policy == PolicyConfig(preemption=False, placement="spread", starvation_age_s=None)
    assert settings.restart_backoff_cap_s == 60.0


def test_a_policy_value_the_type_refuses_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_POLICY__PLACEMENT", "sideways")
    with pytest.raises(ValidationError, match=r"policy\.placement"):
        Settings()
    monkeypatch.setenv("KILN_POLICY__PLACEMENT", "pack")
    monkeypatch.setenv("KILN_POLICY__PREEMPTON", "false")  # misspelt: the policy group forbids unknown names
    with pytest.raises(ValidationError, match="preempton"):
        Settings()


def test_the_dashboard_prices_are_canonical_gpu_types(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_GPU_PRICES", '{"NVIDIA H200": 9.5, "*": 1}')
    assert Settings().gpu_prices == {"H200": 9.5, "*": 1.0}


def test_simulate_replays_the_operators_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    args = ["synthetic:60", "--hosts", "4", "--no-plots", "--tick", "300", "--policies", "fifo,kiln", "--workers", "1"]
    assert simulate([*args, "--out", str(tmp_path / "default")]) == 0
    monkeypatch.setenv("KILN_POLICY__PREEMPTION", "false")
    get_settings.cache_clear()
    assert simulate([*args, "--out", str(tmp_path / "operator")]) == 0
    default = json.loads((tmp_path / "default" / "simulate.json").read_text())
    operator = json.loads((tmp_path / "operator" / "simulate.json").read_text())
    assert default["policy"]["preemption"] is True and operator["policy"]["preemption"] is False
    kiln = {r["policy"]: r for r in operator["sizes"][0]["results"]}["kiln"]
    assert kiln["preemptions"] == 0
