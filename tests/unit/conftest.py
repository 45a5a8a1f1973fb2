"""The unit tier starts no process: every way to start one fails loudly inside a unit test, naming the rule.

A test that needs a real process (a server, torchrun, pip, a compiler, a CLI run as a command) belongs in
tests/e2e (real processes) or tests/integration (real PostgreSQL and Redis): the unit tier stays fast (issue 43:
ten such tests took 327 s of it) and says what it is. Threads, torch's thread pools and everything else inside
the test's own process still work.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

# matplotlib's first import on a machine without its font cache asks fontconfig for the system's fonts (`fc-list`, a
# process), once Debian's chromium has brought fontconfig in: a plot made in a unit test (the replay's report) would
# then break the rule below on a fresh machine only. kiln's plots need no system font: matplotlib's own do.
os.environ.setdefault("MPL_IGNORE_SYSTEM_FONTS", "1")

RULE = (
    "a unit test starts no process (tests/unit/conftest.py): move this test to tests/e2e (real processes) or "
    "tests/integration (real PostgreSQL and Redis), or keep the work inside the test's own process"
)


class ProcessStartInUnitTest(AssertionError):
    """Raised where a unit test tried to start a process; an AssertionError, so it reads as the test failing."""


def _refuse(what: str) -> Any:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise ProcessStartInUnitTest(f"{what}: {RULE}")

    return refuse


# Every door to a new process the standard library has: subprocess (and asyncio and os.popen, which use it) through
# Popen._execute_child; multiprocessing (its pools and concurrent.futures' process pool too) through
# BaseProcess.start; and os's own fork, spawn and system calls, which os.spawn*, pty and the rest reach.
_OS_CALLS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")


@contextmanager
def processes_refused() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", _refuse("subprocess.Popen"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("multiprocessing's Process.start"))
        for name in _OS_CALLS:
            if hasattr(os, name):
                patch.setattr(os, name, _refuse(f"os.{name}"))
        yield


# Hooks rather than a fixture: they cover the whole of each phase, module- and session-scoped fixtures that a unit
# test sets up included, and (being in this directory's conftest) only the unit tests, even when pytest runs the
# unit tier in one process with the others (scripts/test).
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with processes_refused():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with processes_refused():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    with processes_refused():
        return (yield)
