"""Hooks for every test directory."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from harness.workers_cluster import Cluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran a worker cluster reports the tails of its logs: all a CI run shows of what its
    processes did (the test's directory is gone by the time anyone reads it)."""
    report = yield
    if report.failed and Cluster.of_this_test:
        report.sections.append(("kiln cluster logs", "\n".join(c.failure_report() for c in Cluster.of_this_test)))
    if report.when == "teardown":
        Cluster.of_this_test.clear()
    return report


_tier_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add the test's setup, call and teardown time to its tier's (``tests/<tier>/...``)."""
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _tier_seconds[tier] = _tier_seconds.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each tier's test time in this process: what the closing notes compare before and after (docs/testing.md).
    make test runs two processes at once, so a tier's time is its own, not a share of the wall clock."""
    if _tier_seconds:
        times = ", ".join(f"{tier} {seconds:.1f} s" for tier, seconds in sorted(_tier_seconds.items()))
        terminalreporter.write_line(f"tier times: {times}")
