"""This worker process's own state: its host, incarnation and GPUs, its metrics, its shutdown flag and the threads
supervising its attempts (set by ``python -m workers``, read by the claim, the environment and the runner)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from workers.consumer_probe import ConsumerProbe
from workers.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# Set by ``python -m workers`` before the worker consumes: the host this process serves, and this process's
# incarnation (recorded on each node it claims: a later worker process on the host knows it was not its own).
CURRENT_HOST: str | None = None
WORKER_INCARNATION: str | None = None
HOST_GPUS = 0  # the GPUs of this worker's host, set by ``python -m workers`` (a rank's part of the host's cores)
METRICS = WorkerMetrics()  # this worker process's (its host agent's too); served by workers.__main__
# Set when the worker starts a warm shutdown: running attempts checkpoint and go back to the queue.
SHUTTING_DOWN = threading.Event()
# Set by ``python -m workers``: the probe that tells the host agent whether this process's consumer consumes.
CONSUMER_PROBE: ConsumerProbe | None = None

POLL_S = 0.25  # how often the supervisor looks at the trainer and its telemetry


class Supervisions:
    """The threads supervising this process's running attempts. They belong to the worker process, not to Celery's
    pool: a Celery consumer that dies (and is started again, ``python -m workers``) leaves them running, and a
    warm shutdown waits for them (``join``) after the consumer has stopped."""

    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, name: str, target: Callable[[], object]) -> None:
        def run() -> None:
            try:
                target()
            except Exception:
                log.exception("supervision %s failed", name)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def running(self) -> int:
        with self._lock:
            return len(self._threads)

    def join(self, timeout_s: float) -> bool:
        """Wait for every supervision to end (at most ``timeout_s``); True when none is left."""
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return self.running() == 0


SUPERVISIONS = Supervisions()
