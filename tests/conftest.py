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
