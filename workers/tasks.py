"""``kiln.run_attempt``: claim an attempt's node under its fencing token (``workers.claim``), then hand it to a
supervision thread of the worker process (``workers.launch``) that runs torchrun for it and reports how it ended;
``kiln.probe_consumer``: the consumer probe's task."""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Any

from celery.exceptions import Reject
from celery.signals import worker_ready, worker_shutting_down

from core.settings import get_settings
from core.trainer_protocol import ENV_TEST_HOOKS
from workers import worker_state
from workers.celery_app import TASK_PROBE_CONSUMER, TASK_RUN_ATTEMPT, get_app
from workers.claim import claim_delivery
from workers.launch import run_claimed
from workers.worker_state import SHUTTING_DOWN, SUPERVISIONS

log = logging.getLogger(__name__)
app = get_app()


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    SHUTTING_DOWN.set()


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    if worker_state.CONSUMER_PROBE is not None:  # the consumer has connected and consumes from now on
        worker_state.CONSUMER_PROBE.seen()


@app.task(name=TASK_RUN_ATTEMPT, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_attempt(self: Any, attempt_id: int, fencing_token: int, node_rank: int = 0) -> str:
    """Claim, then hand the attempt to a supervision thread of the worker process and return: the message is
    acknowledged once the claim is committed (see ``workers.celery_app``), and the consumer's life is no longer
    tied to the attempt's (hours)."""
    host = worker_state.CURRENT_HOST or ""
    delivery = str(getattr(self.request, "id", "") or "")
    redelivered = bool((getattr(self.request, "delivery_info", None) or {}).get("redelivered"))
    if redelivered:
        delivery += ":redelivered"
    if SHUTTING_DOWN.is_set():
        # A delivery that reaches a worker in its warm shutdown goes back to the host's queue unclaimed, for the
        # worker that comes back (or the reconciler, if none does): claimed here, it would start a trainer only to
        # drain it at once (an extra DRAINED attempt, test_a_worker_shutting_down_drains_its_attempts...).
        time.sleep(1.0)  # not a hot loop of redeliveries while this consumer still consumes
        raise Reject("the worker is shutting down", requeue=True)
    settings = get_settings()
    _hold_delivery_for_a_test(attempt_id)
    won = claim_delivery(
        attempt_id=attempt_id,
        fencing_token=fencing_token,
        node_rank=node_rank,
        host=host,
        delivery=delivery,
        settings=settings,
    )
    if won is None:
        return "refused"
    claimed, claimed_at = won
    SUPERVISIONS.start(
        f"attempt-{attempt_id}-node{node_rank}",
        functools.partial(
            run_claimed,
            claimed=claimed,
            claimed_at=claimed_at,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
            node_rank=node_rank,
            host=host,
            settings=settings,
        ),
    )
    return "started"


def _hold_delivery_for_a_test(attempt_id: int) -> None:
    """``KILN_TEST_HOOKS={"hold_delivery_s": S}`` (tests only, see docs/workers.md): keep the message unacknowledged
    S seconds before the claim, the window in which a broker crash kills kombu's consumer."""
    raw = os.environ.get(ENV_TEST_HOOKS)
    hold = float(json.loads(raw).get("hold_delivery_s") or 0.0) if raw else 0.0
    if hold > 0:
        log.warning("TEST HOOK: holding the delivery of attempt %s for %.1f s before its claim", attempt_id, hold)
        time.sleep(hold)


@app.task(name=TASK_PROBE_CONSUMER, ignore_result=True)
def probe_consumer() -> None:
    """Run by the consumer: it consumes the host's queue (``workers.consumer_probe``)."""
    if worker_state.CONSUMER_PROBE is not None:
        worker_state.CONSUMER_PROBE.seen()
