"""Token buckets: one per user (however many tokens they mint) and one per client address for failed
authentications; shared by every API process through Redis, or in process memory.

With Redis as the broker (every multi-process deployment: ``docker-compose.yml``), the buckets live in Redis and
one Lua script refills and takes atomically on the server's clock, so N uvicorn workers or N API replicas share
one limit per token. With the embedded default (no Redis) there is one API process and the buckets live in it.

If Redis cannot be reached, a request is limited by this process's own bucket instead (the API does not go down
with its rate limiter; the bound is then per process, as with the embedded default).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

log = logging.getLogger(__name__)


class Limiter(Protocol):
    def take(self, key: str) -> float:
        """0.0 if a request may pass (and takes a token), else the seconds until one is available."""
        ...


class TokenBucketLimiter:
    """Buckets in this process's memory."""

    def __init__(self, per_minute: int, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = per_minute / 60.0  # tokens per second
        self.burst = float(max(burst, 1))
        self.max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
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


# KEYS[1] the bucket; ARGV: rate (tokens/s), burst. Returns the wait in seconds as a string (Lua numbers would be
# truncated to integers on the way back). The key expires once the bucket would be full again: a full bucket and a
# missing one are the same.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
elseif rate > 0 then
  wait = (1 - tokens) / rate
else
  wait = 60
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
if rate > 0 then
  redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
end
return tostring(wait)
"""


class RedisTokenBucketLimiter:
    """Buckets in Redis, shared by every API process that uses the same Redis."""

    def __init__(self, url: str, per_minute: int, burst: int, *, prefix: str = "kiln:ratelimit:") -> None:
        import redis  # only where Redis is the broker

        self.rate = per_minute / 60.0
        self.burst = float(max(burst, 1))
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        self.script = self.client.register_script(_TAKE)
        self.unavailable = redis.RedisError  # kept, so a request does not import redis again
        self.fallback = TokenBucketLimiter(per_minute, burst)
        self._warned = False

    def take(self, key: str) -> float:
        try:
            wait = float(self.script(keys=[f"{self.prefix}{key}"], args=[self.rate, self.burst]))
        except self.unavailable as exc:
            if not self._warned:  # once per outage, not once per request
                log.warning("rate limiter: Redis unavailable (%s); limiting per API process until it is back", exc)
                self._warned = True
            return self.fallback.take(key)
        self._warned = False
        return wait


def make_limiter(broker_url: str, per_minute: int, burst: int, *, prefix: str = "kiln:ratelimit:") -> Limiter:
    """Shared through Redis when Redis is the broker, else in this process."""
    if broker_url.startswith(("redis://", "rediss://")):
        return RedisTokenBucketLimiter(broker_url, per_minute, burst, prefix=prefix)
    return TokenBucketLimiter(per_minute, burst)


class FailedAuthentications:
    """Failed authentications per client address: a bucket shared like the others, and, once it is empty, a note
    in this process so that the address's next failures are refused without a Redis call while it waits. Only
    failures count and only failures are refused: a request whose token is valid never asks (``api.auth``)."""

    def __init__(self, limiter: Limiter, *, max_keys: int = 100_000):
        self.limiter = limiter
        self.max_keys = max_keys
        self._until: dict[str, float] = {}  # address -> monotonic time its refusals end
        self._lock = threading.Lock()

    def blocked_for(self, address: str, now: float | None = None) -> float:
        """Seconds this address must still wait (0.0: it may try)."""
        until = self._until.get(address)
        if until is None:
            return 0.0
        wait = until - (time.monotonic() if now is None else now)
        if wait <= 0:
            with self._lock:
                self._until.pop(address, None)
            return 0.0
        return wait

    def failed(self, address: str, now: float | None = None) -> float:
        """Count a failure; the seconds to wait when the address has used up its failures, else 0.0."""
        wait = self.limiter.take(f"auth-failure:{address}")
        if wait > 0:
            with self._lock:
                if len(self._until) >= self.max_keys:
                    self._until.clear()  # a flood of addresses: forget the notes, the shared bucket still counts
                self._until[address] = (time.monotonic() if now is None else now) + wait
        return wait
