"""The scheduler's and each worker's own Prometheus listener (the API's metrics are on its ``/metrics``).

These processes serve no HTTP otherwise, so each exports on a port of its own (``KILN_SCHEDULER_METRICS_PORT``,
``KILN_WORKER_METRICS_PORT``; 0, the default, exports nothing), bound to ``KILN_METRICS_BIND`` (127.0.0.1 unless
set). They carry no team names and no tokens -- cycle times, decisions, deliveries, heartbeats, GPU health -- so
the listener needs no scrape token; keep it on the hosts' private network (docs/deploy.md, "Metrics").
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


def serve(registry: CollectorRegistry, *, port: int, bind: str, what: str) -> bool:
    """Start the listener in a daemon thread; a port already taken is logged, never fatal (the process's real
    work matters more than its metrics). Returns whether it listens."""
    if port <= 0:
        return False
    try:
        start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        log.error("%s metrics: cannot listen on %s:%d (%s); not exported", what, bind, port, exc)
        return False
    log.info("%s metrics on http://%s:%d/metrics", what, bind, port)
    return True
