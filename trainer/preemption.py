"""SIGTERM -> finish the current step, commit a checkpoint, exit ExitCode.PREEMPTED.

The handler only sets a flag; the loop polls it once per step.  Ranks may see the signal at different steps,
so the loop agrees on it through a host-side all-reduce (MAX) before acting: every rank stops at the same step.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class PreemptionFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        for s in signals:
            self._old[s] = signal.signal(s, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.signum = signum
        self._event.set()

    def restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()

    @property
    def requested(self) -> bool:
        return self._event.is_set()
