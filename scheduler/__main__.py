"""``python -m scheduler``: the scheduler loop and the webhook notifier (``kiln up`` and docker-compose run this).

The process entry point wires the broker in: the loop is handed ``workers.dispatch.dispatch_attempt`` to send
admitted attempts to their hosts, so that no scheduler module imports the workers. The notifier is a thread of its
own (scheduler/live/notifier.py says why it lives here); both export their metrics on
``KILN_SCHEDULER_METRICS_PORT`` (scheduler/live/metrics.py).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from sqlalchemy.orm import sessionmaker

from core.db import make_engine
from core.deployment import StorageOfAnotherDeployment
from core.process_metrics import serve
from core.settings import get_settings
from scheduler.live.loop import run_forever
from scheduler.live.metrics import SchedulerMetrics
from scheduler.live.notifier import Notifier
from workers.dispatch import dispatch_attempt

log = logging.getLogger("kiln.scheduler")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = get_settings()
    metrics = SchedulerMetrics()
    serve(metrics.registry, port=settings.scheduler_metrics_port, bind=settings.metrics_bind, what="scheduler")
    # Its own small pool: a slow receiver holds one connection, never one the scheduling cycle needs.
    pool: dict[str, Any] = (
        {} if settings.resolved_database_url.startswith("sqlite") else {"pool_size": 2, "max_overflow": 2}
    )
    engine = make_engine(settings.resolved_database_url, settings=settings, **pool)
    notifier = Notifier(
        settings=settings, session_factory=sessionmaker(bind=engine, expire_on_commit=False), metrics=metrics
    )
    thread = threading.Thread(target=notifier.run, args=(stop,), name="webhook-notifier", daemon=True)
    thread.start()
    try:
        run_forever(settings, dispatch=dispatch_attempt, stop=stop, metrics=metrics)
    except StorageOfAnotherDeployment as exc:
        log.error("%s", exc)
        raise SystemExit(2) from None
    finally:
        stop.set()
        thread.join(timeout=settings.webhook_timeout_s + 5)
        engine.dispose()


if __name__ == "__main__":
    main()
