"""Fixtures that more than one e2e file uses."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.test_kiln_up import Up, up_running
from tests.support.workers_cluster import Cluster


@pytest.fixture
def kiln_up(tmp_path: Path) -> Iterator[Up]:
    """``kiln up`` running from ``tmp_path`` (:func:`up_running`)."""
    with up_running(tmp_path) as up:
        yield up


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
