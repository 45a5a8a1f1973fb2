"""``python -m scheduler``: the scheduler loop (``kiln up`` and docker-compose run this)."""

from __future__ import annotations

import logging
import signal
import threading

from core.settings import get_settings
from scheduler.live.loop import run_forever


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_forever(get_settings(), stop=stop)


if __name__ == "__main__":
    main()
