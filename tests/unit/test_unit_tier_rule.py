"""The unit tier's rule, held by tests/unit/conftest.py: every way to start a process fails, naming the rule; threads
and torch's own thread pools still work."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from harness.deps import require_module
from tests.unit.conftest import RULE, ProcessStartInUnitTest


def _asyncio_subprocess() -> None:
    async def start() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    asyncio.run(start())


def _process_pool() -> None:
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        pool.submit(abs, -1).result()


STARTS: dict[str, Callable[[], object]] = {
    "subprocess.run": lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    "os.popen": lambda: os.popen("true").read(),
    "asyncio": _asyncio_subprocess,
    "multiprocessing fork": lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "a process pool": _process_pool,
    "os.fork": lambda: os.fork(),  # looked up when called: the rule replaces os.fork for each test
    "os.system": lambda: os.system("true"),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
}


@pytest.mark.parametrize("how", list(STARTS))
def test_starting_a_process_fails_naming_the_rule(how: str) -> None:
    with pytest.raises(ProcessStartInUnitTest) as refused:
        STARTS[how]()
    assert RULE in str(refused.value)


def test_threads_and_torchs_thread_pools_still_work() -> None:
    torch = require_module("torch")
    done: list[int] = []
    worker = threading.Thread(target=done.append, args=(1,))
    worker.start()
    worker.join()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(abs, [-1, -2])) == [1, 2]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # intra-op work spread over threads of this process
    try:
        a = torch.ones(256, 256)
        assert float((a @ a).sum()) == 256.0**3
    finally:
        torch.set_num_threads(threads)
    assert done == [1]
