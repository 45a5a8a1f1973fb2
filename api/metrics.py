"""The API's Prometheus registry, whether the API runs as one process or several.

``uvicorn --workers N`` (docker-compose runs 4) forks N processes that each count their own requests, and a scrape
reaches only one of them. With ``PROMETHEUS_MULTIPROC_DIR`` set (prometheus_client's own variable: a directory,
emptied before the API starts; docker-compose does both), each process writes its counters and histogram buckets
to files there and every scrape sums all of them (``MultiProcessCollector``). Without it (``kiln up`` runs one
process) they live in the app's registry.

What the API computes from the database at scrape time (jobs by state, the operators' metrics) is the same in
every process, so it is never written to those files: it stays in the app's registry either way.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def http_metrics_registry(app_registry: CollectorRegistry) -> CollectorRegistry | None:
    """Where the per-request metrics register: nowhere in multiprocess mode (the files are read instead)."""
    return None if multiprocess_dir() else app_registry


def scrape_registry(app_registry: CollectorRegistry) -> CollectorRegistry:
    """What one scrape renders: the app's registry, plus every process's files in multiprocess mode."""
    directory = multiprocess_dir()
    if directory is None:
        return app_registry
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    registry.register(app_registry)  # a registry collects like a collector
    return registry
