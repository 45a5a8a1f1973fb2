"""The compile's circuit breaker: a wall-clock alarm and a host-RSS watcher, either of which interrupts a compile
in the main thread (``Trip``) so the job falls back to eager instead of hanging or running out of memory."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil


class Trip(Exception):
    """Raised in the main thread by the breaker's alarm (timeout or RSS)."""


class RssTree:
    """Host RSS of this process and its compile workers, cheaply.  ``psutil.Process.children(recursive=True)``
    walks every process in /proc; on the H200 host (gVisor) that took ~45 ms a call, and polled every 0.1 s
    the watcher thread held the GIL against Dynamo's tracing: 21.6 s of polling during a 31 s cold compile,
    3.8 s during an 8.2 s warm one (bench/results/compile_warm_probe.json).  The worker list is refreshed every
    ``refresh_s``; each poll reads only the known processes' RSS."""

    def __init__(self, refresh_s: float = 2.0) -> None:
        self.proc = psutil.Process()
        self.refresh_s = refresh_s
        self.children: list[psutil.Process] = []
        self.listed = -float("inf")

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self.listed >= self.refresh_s:
            with contextlib.suppress(psutil.Error):
                self.children = self.proc.children(recursive=True)  # Inductor's parallel compile workers
            self.listed = now
        total = self.proc.memory_info().rss
        for child in self.children:
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total


@contextlib.contextmanager
def breaker(timeout_s: float, max_rss: int | None) -> Iterator[dict[str, Any]]:
    """Arm a SIGALRM for the time limit and a thread polling RSS; either trips ``Trip`` in this thread."""
    rss_tree = RssTree()
    state: dict[str, Any] = {"reason": None, "peak_rss": rss_tree(), "poll_s": 0.0}
    if max_rss is not None and state["peak_rss"] > max_rss:
        # Over the limit before compiling: the caller does not start (a trip raised into Dynamo mid-trace can
        # leave its C++ state broken: a CI run aborted with SIGABRT after one).
        state["reason"] = "FALLBACK_OOM_DETECTED"
    stop = threading.Event()
    main = threading.main_thread().ident

    def on_alarm(signum: int, frame: Any) -> None:
        if state["reason"] is None:
            state["reason"] = "FALLBACK_COMPILE_TIMEOUT"
        raise Trip(state["reason"])

    def watch() -> None:
        interval = 0.1
        while not stop.wait(interval):
            t = time.perf_counter()
            rss = rss_tree()
            cost = time.perf_counter() - t
            state["poll_s"] += cost  # reported: time this thread competed with the compiler for the GIL
            interval = min(1.0, max(0.1, 20 * cost))  # at most ~5% of the time, and a reading every second
            state["peak_rss"] = max(state["peak_rss"], rss)
            if max_rss is not None and rss > max_rss and state["reason"] is None:
                state["reason"] = "FALLBACK_OOM_DETECTED"
                if main is not None:
                    signal.pthread_kill(main, signal.SIGALRM)
                return

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    watcher = threading.Thread(target=watch, name="kiln-compile-rss", daemon=True)
    watcher.start()
    try:
        yield state
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        stop.set()
        watcher.join()
        signal.signal(signal.SIGALRM, old)
