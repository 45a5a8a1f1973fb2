"""A token bucket per API token, in process memory.

Limitation: the buckets live in each API process. With N uvicorn workers (or N API replicas) a token gets up to
N times the configured rate, and a restart refills every bucket. That bounds a runaway client per process, which
is the purpose here; a cluster-wide limit would keep the buckets in Redis (an atomic Lua script per request).
"""

from __future__ import annotations

import threading
import time


class TokenBucketLimiter:
    def __init__(self, per_minute: int, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = per_minute / 60.0  # tokens per second
        self.burst = float(max(burst, 1))
        self.max_keys = max_keys
        self._buckets: dict[int, tuple[float, float]] = {}  # key -> (tokens, last refill time)
        self._lock = threading.Lock()

    def take(self, key: int, now: float | None = None) -> float:
        """0.0 if a request may pass (and takes a token), else the seconds until one is available."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                if len(self._buckets) > self.max_keys:
                    self._prune(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate if self.rate > 0 else 60.0

    def _prune(self, now: float) -> None:
        """Forget buckets that have refilled completely: they are indistinguishable from new ones."""
        full = [k for k, (t, last) in self._buckets.items() if t + (now - last) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]
