"""``promtool check rules`` accepts ops/prometheus/alerts.yml, where promtool is installed (a process of its own;
the checks of the rules' metric names are tests/unit/test_ops_alerts.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.test_ops_alerts import ALERTS

pytestmark = pytest.mark.e2e


def test_promtool_accepts_the_rules_where_it_is_installed() -> None:
    """Where promtool is installed it has the last word; elsewhere the unit tests' checks are the check."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return
    result = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
