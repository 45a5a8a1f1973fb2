"""``python -m scheduler``: the scheduler loop (``kiln up`` and docker-compose run this).

The process entry point wires the broker in: the loop is handed ``workers.dispatch.dispatch_attempt`` to send
admitted attempts to their hosts, so that no scheduler module imports the workers."""

from __future__ import annotations

import logging
import signal
import threading

from core.settings import get_settings
from scheduler.live.loop import run_forever
from workers.dispatch import dispatch_attempt


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_forever(get_settings(), dispatch=dispatch_attempt, stop=stop)


if __name__ == "__main__":
    main()
