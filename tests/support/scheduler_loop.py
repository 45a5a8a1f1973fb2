"""``python -m scheduler``'s own loop (``scheduler.live.loop.run_forever``: campaign for the lead, then a cycle on
each NOTIFY and every interval) in a thread of the test process, for tests of leadership and liveness."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from core.settings import Settings
from scheduler.live.loop import run_forever
from scheduler.live.metrics import SchedulerMetrics


class LoopThread:
    """The loop, started; ``dispatch`` sends what it admits (``workers.dispatch.dispatch_attempt``, or a recorder)."""

    def __init__(self, settings: Settings, dispatch: Callable[[int, int, list[Any]], None]) -> None:
        self.stop = threading.Event()
        self.metrics = SchedulerMetrics()
        kwargs = {"stop": self.stop, "dispatch": dispatch, "metrics": self.metrics}
        self.thread = threading.Thread(target=run_forever, args=(settings,), kwargs=kwargs, daemon=True)
        self.thread.start()

    def halt(self) -> bool:
        """Stop the loop (a SIGTERM's way) and wait for it up to 20 s; whether it has stopped."""
        self.stop.set()
        self.thread.join(timeout=20)
        return not self.thread.is_alive()

    def cycles(self) -> int:
        """The scheduling cycles it has committed so far (its metrics' count)."""
        count = self.metrics.registry.get_sample_value("kiln_scheduler_cycle_seconds_count")
        return int(count or 0)
