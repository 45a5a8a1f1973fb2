"""The test suite's own rules: a missing dependency fails in CI, browser tests leave tracked files alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.dashboard import DOCS_IMG, REFRESH_SCREENSHOTS, screenshot_dir
from harness.deps import require_module

TESTS = Path(__file__).resolve().parents[1]


def test_a_missing_module_skips_on_a_laptop_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_module("kiln_no_such_module")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="kiln_no_such_module"):
        require_module("kiln_no_such_module")


def test_no_test_skips_for_a_dependency_behind_the_ci_rule() -> None:
    """``pytest.importorskip`` would skip in CI too: tests use ``harness.deps`` instead."""
    offenders = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if re.search(r"\bimportorskip\(", path.read_text()) and path.name != Path(__file__).name
    ]
    assert offenders == []


def test_screenshots_go_to_docs_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    screenshot_dir.cache_clear()
    monkeypatch.delenv(REFRESH_SCREENSHOTS, raising=False)
    assert not screenshot_dir().is_relative_to(DOCS_IMG.parent.parent)
    screenshot_dir.cache_clear()
    monkeypatch.setenv(REFRESH_SCREENSHOTS, "1")
    assert screenshot_dir() == DOCS_IMG
    screenshot_dir.cache_clear()
