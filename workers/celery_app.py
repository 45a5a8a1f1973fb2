"""The Celery application of the workers: one queue per host, settings chosen for hours-long training tasks.

Celery is only the doorbell here. PostgreSQL holds every attempt, its placement, its lease and its fencing
token; a message that is lost is re-sent by the reconciler, and a message that is delivered twice is refused
by the fencing token. The settings below therefore favour "never drop a task silently" over "never deliver twice".
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from core.settings import get_settings

TASK_RUN_ATTEMPT = "kiln.run_attempt"
TASK_PROBE_CONSUMER = "kiln.probe_consumer"  # workers.consumer_probe: the host consumes its queue


def host_queue(host_name: str) -> str:
    """Each host consumes only its own queue, so a placement decides exactly where an attempt runs."""
    return f"host.{host_name}"


def make_celery(broker_url: str, *, visibility_timeout_s: float | None = None) -> Celery:
    app = Celery("kiln", broker=broker_url, include=["workers.tasks"])
    transport_options: dict[str, object] = {}
    if not broker_url.startswith("sqla+"):
        # Redis: an unacknowledged message is handed out again after this long. A training task holds its
        # message (late ack) for hours, so a short timeout means a redelivery of every long job; that is
        # harmless (the fencing token refuses it in milliseconds) but noisy, so production uses 12 h: longer
        # than almost every attempt, and a message stranded by a dead worker is replaced by the reconciler's
        # re-dispatch long before it matters. Tests lower it to force a redelivery.
        # (kombu's SQLAlchemy transport hands these options to create_engine and has no redelivery at all:
        # the embedded default relies on the reconciler alone, which is enough for one laptop.)
        transport_options["visibility_timeout"] = (
            visibility_timeout_s if visibility_timeout_s is not None else 12 * 3600.0
        )
        if visibility_timeout_s is not None and visibility_timeout_s < 60:
            # A short timeout is only useful if the unacked set is scanned as often (kombu's default scans
            # every ~10 s x a throttle of 10).
            transport_options["unacked_restore_interval"] = 1
            transport_options["unacked_restore_throttle"] = 1
    app.conf.update(
        broker_transport_options=transport_options,
        # One message at a time per free thread: a worker must not reserve a second training task that
        # would wait behind a running one for hours while another host sits idle.
        worker_prefetch_multiplier=1,
        # Acknowledge once the task has returned, that is once the attempt's claim is committed (or refused): a
        # worker killed before then leaves the message to be redelivered. After the claim the message is worth
        # nothing (every later delivery of it is refused by the claim) and the attempt is supervised outside the
        # task (workers.tasks), so the consumer holds no unacknowledged message while training runs: a broker
        # crash then finds nothing to restore, which is where kombu's consumer died (workers.consumer_probe).
        task_acks_late=True,
        # ...and the same when the executing process itself dies (OOM killer, SIGKILL) during a claim.
        task_reject_on_worker_lost=True,
        # A broker restart must not kill hours of training: the attempt keeps running and its lease lives in
        # PostgreSQL, not in the broker connection.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # keep reconnecting through a Redis restart, forever
        # Results live in PostgreSQL (attempt exit code and reason); there is no result backend.
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue="kiln.default",
        # Liveness of hosts is the host agent's heartbeat in PostgreSQL; Celery's own events are not needed.
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        timezone="UTC",
        enable_utc=True,
    )
    return app


def declare_host_queue(app: Celery, host_name: str) -> None:
    """Create the host's queue on the broker; the worker does it before it registers the host.

    kombu's SQLAlchemy transport (the embedded default) declares a queue by SELECT then INSERT, not atomically:
    a worker's consumer starting while the scheduler's first dispatch to the just-registered host declares the
    same queue can both INSERT, and the loser dies on the UNIQUE constraint (seen: the worker, at start-up).
    Declared before the host is visible to the scheduler, the queue exists before anyone else can declare it.
    """
    queue = app.amqp.queues.new_missing(host_queue(host_name))  # the queue as Celery declares it
    with app.connection_for_write() as conn:
        queue.bind(conn.default_channel).declare()


@lru_cache
def get_app() -> Celery:
    """The process-wide app on ``settings.resolved_broker_url`` (Redis in production, sqla+sqlite embedded), with
    ``settings.broker_visibility_timeout_s`` (env ``KILN_BROKER_VISIBILITY_TIMEOUT_S``; default 12 h)."""
    settings = get_settings()
    return make_celery(settings.resolved_broker_url, visibility_timeout_s=settings.broker_visibility_timeout_s)
