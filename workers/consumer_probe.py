"""Whether this worker's Celery consumer really consumes its host's queue.

A worker process can heartbeat (its host agent thread writes PostgreSQL) while its Celery consumer consumes
nothing: Redis killed while the consumer held an unacknowledged message killed the consumer in kombu's
``restore_unacked_once`` (``AttributeError: 'NoneType' object has no attribute 'hostname'``, celery/kombu#970,
celery/celery#10205), and the scheduler kept placing attempts on a host that never picked them up. So the host
agent does not take its own heartbeat as proof: a probe thread sends a small ``kiln.probe_consumer`` message to the
host's own queue, through the broker, the way the scheduler dispatches; the consumer's running it is the proof.
The host is UP only while a probe was consumed recently (``workers.host_agent``), else UNREACHABLE: never placed
on, and shown as such by ``kiln hosts``.

The probe exercises the whole path an attempt takes (broker reachable, queue consumed, a free pool thread), on
every transport, the embedded SQLAlchemy one included (which has no broadcast channel for Celery's ``ping``).
"""

from __future__ import annotations

import logging
import threading
import time

from celery import Celery

from workers.celery_app import TASK_PROBE_CONSUMER, host_queue

log = logging.getLogger(__name__)

# A consumer not seen for this many heartbeat intervals is not consuming: several probes went unanswered, each
# sent again after two intervals (a probe lost with a restarted broker is replaced before the limit).
SILENT_INTERVALS = 5
MIN_SILENT_S = 5.0
# Before the consumer was seen at all: Celery's start-up (imports, connection) on a loaded host.
STARTUP_GRACE_S = 60.0


class _WithoutProbes(logging.Filter):
    """Celery logs every task it receives and runs; a probe every few seconds would bury the attempts' lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return TASK_PROBE_CONSUMER not in record.getMessage()


def quiet_probe_logs() -> None:
    for name in ("celery.worker.strategy", "celery.app.trace"):
        logging.getLogger(name).addFilter(_WithoutProbes())


class ConsumerProbe:
    """Sends probes to the host's queue and remembers when this process's consumer last ran one."""

    def __init__(self, *, app: Celery, host: str, heartbeat_interval_s: float) -> None:
        self.app = app
        self.queue = host_queue(host)
        self.interval_s = heartbeat_interval_s
        self.silent_limit_s = max(MIN_SILENT_S, SILENT_INTERVALS * heartbeat_interval_s)
        self._started = time.monotonic()
        self._seen: float | None = None  # monotonic time the consumer last ran a probe (or became ready)
        self._sent: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the consumer calls ---------------------------------------------------------------------------------

    def seen(self) -> None:
        """The consumer ran a probe (or has just connected and started consuming)."""
        self._seen = time.monotonic()

    # -- what the host agent reads -------------------------------------------------------------------------------

    def silent_s(self) -> float:
        """Seconds since the consumer was last seen (since the probe started, before it was ever seen)."""
        return time.monotonic() - (self._seen if self._seen is not None else self._started)

    def consuming(self) -> bool:
        limit = self.silent_limit_s if self._seen is not None else max(self.silent_limit_s, STARTUP_GRACE_S)
        return self.silent_s() <= limit

    # -- the probe thread ----------------------------------------------------------------------------------------

    def send(self) -> None:
        """One probe on the host's queue. It expires when it could no longer prove anything (a consumer that comes
        back drops a backlog of old probes at once); a broker that is away raises at once, not after retries."""
        self.app.send_task(
            TASK_PROBE_CONSUMER, queue=self.queue, routing_key=self.queue, expires=self.silent_limit_s, retry=False
        )
        self._sent = time.monotonic()

    def _due(self) -> bool:
        if self._sent is None:
            return True
        answered = self._seen is not None and self._seen >= self._sent
        # Answered: the next one an interval later. Unanswered: sent again after two (lost with a broker restart).
        return time.monotonic() - self._sent >= (1 if answered else 2) * self.interval_s

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._due():
                try:
                    self.send()
                except Exception as exc:  # the broker is away: the host shows UNREACHABLE until it is back
                    self._sent = time.monotonic()
                    log.warning("consumer probe not sent (broker unavailable?): %s", exc)
            self._stop.wait(min(1.0, self.interval_s / 2))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="consumer-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
