"""Telemetry: one JSON object per line in ``RUN_DIR/telemetry/rank{R}.jsonl`` (core.trainer_protocol).

Each rank writes its own file, the trainer's (``trainer.run``) or a script's (``rank.script``, and the script's
own ``trainer.script_client``); the worker tails these files and relays them (``workers.telemetry_relay``). The
writing side of the worker/trainer protocol, so it lives beside it: the standard library only, and imported by
the rank process without the trainer. Writes are line-buffered, flushed per record and serialised by a lock,
because the heartbeat and NVML threads write beside the training loop.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

from core.trainer_protocol import TELEMETRY_DIR, RecordKind


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: report them as null (absent), never as a made-up number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class Telemetry:
    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        self.dir = pathlib.Path(run_dir) / TELEMETRY_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"rank{rank}.jsonl"
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as self
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def emit(self, kind: RecordKind, **fields: Any) -> None:
        record = {"ts": time.time(), "rank": self.rank, "kind": str(kind), **_clean(fields)}
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")
                self._fh.flush()

    def event(self, type_: str, message: str, **fields: Any) -> None:
        self.emit(RecordKind.EVENT, type=type_, message=message, fields=fields)

    def diagnostic(self, type_: str, message: str, **fields: Any) -> None:
        self.emit(RecordKind.DIAGNOSTIC, type=type_, message=message, fields=fields)

    def every(self, interval_s: float, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` every ``interval_s`` in a daemon thread until ``close``; errors become events."""

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    fn()
                except Exception as exc:  # a broken sampler must never take the training down
                    self.event("TELEMETRY_ERROR", f"{name}: {exc!r}", sampler=name)

        t = threading.Thread(target=loop, name=f"kiln-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        with self._lock:
            self._fh.close()
