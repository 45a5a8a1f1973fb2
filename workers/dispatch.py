"""Send an admitted attempt to the hosts of its placement (called by the scheduler after its commit).

Never imports torch: the scheduler and the API import this module.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from workers.celery_app import TASK_RUN_ATTEMPT, get_app, host_queue

log = logging.getLogger(__name__)


def dispatch_attempt(
    attempt_id: int, fencing_token: int, placement: list[dict[str, Any]], *, app: Celery | None = None
) -> None:
    """One ``kiln.run_attempt`` message per placed node, on that host's own queue.

    Called only after the transaction that created the attempt committed, so a worker that receives the
    message always finds the attempt. A failure to publish raises; the reconciler re-dispatches attempts
    that no worker picked up, so the caller may log and carry on.
    """
    celery = app or get_app()
    for i, node in enumerate(placement):
        node_rank = int(node.get("node_rank", i))
        queue = node.get("queue") or host_queue(node["host"])
        celery.send_task(
            TASK_RUN_ATTEMPT,
            kwargs={"attempt_id": attempt_id, "fencing_token": fencing_token, "node_rank": node_rank},
            queue=queue,
            routing_key=queue,
            # Publishing must not hang the scheduler loop when Redis is away; the reconciler retries later.
            retry=True,
            retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0},
        )
        log.info("dispatched attempt %s (token %s) node %s to %s", attempt_id, fencing_token, node_rank, queue)
