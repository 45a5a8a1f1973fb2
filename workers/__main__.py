"""``python -m workers --host NAME [--cpu-slots N] [--broker URL]``: one worker process per host.

It registers the host (and its GPUs through NVML; none -> CPU slots), starts the host agent's heartbeat and the
consumer probe, and consumes the host's own queue: a task claims an attempt and hands it to a thread of this
process that supervises its torchrun. A Celery consumer that stops on its own (a broker crash can kill it) is
started again in this same process: the attempts' supervision threads, and so their trainers, carry on.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

    from core.settings import Settings
    from workers.host_agent import HostAgent
    from workers.isolation import Isolation
    from workers.mps import MpsDaemon

log = logging.getLogger("kiln.worker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    p.add_argument("--host", default=socket.gethostname(), help="host name (its queue is host.<NAME>)")
    p.add_argument("--cpu-slots", type=int, default=None, help="training processes offered when there is no GPU")
    p.add_argument("--broker", default=None, help="broker URL (default: settings.resolved_broker_url)")
    p.add_argument("--address", default=None, help="address other hosts use for rendezvous (default: hostname)")
    p.add_argument("--loglevel", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Checkpoints, compile caches, run dirs and logs hold a team's work: nothing the worker or a trainer writes is
    # readable by other users of the host (the logs the API reads: core/private.py).
    os.umask(0o077)
    settings = _settings(args)
    from core.liveness import Pulse
    from core.process_metrics import serve
    from workers import attempt_setup, worker_state
    from workers.consumer_probe import ConsumerProbe, quiet_probe_logs
    from workers.exports import ExportRunner
    from workers.host_agent import HostAgent
    from workers.inventory import detect_inventory
    from workers.tasks import app  # the Celery app, with its tasks and this worker's signal handlers

    inventory = detect_inventory()
    worker_state.WORKER_INCARNATION = secrets.token_hex(6)
    cpu_slots = args.cpu_slots if args.cpu_slots is not None else max(1, (os.cpu_count() or 2) // 2)
    quiet_probe_logs()
    probe = worker_state.CONSUMER_PROBE = ConsumerProbe(
        app=app, host=args.host, heartbeat_interval_s=settings.heartbeat_interval_s
    )
    agent = HostAgent(
        name=args.host,
        inventory=inventory,
        cpu_slots=cpu_slots,
        address=args.address or socket.gethostname(),
        settings=settings,
        incarnation=worker_state.WORKER_INCARNATION,
        pulse=Pulse(settings.liveness_file, settings.heartbeat_interval_s),
        consumer=probe,
        metrics=worker_state.METRICS,
    )
    serve(worker_state.METRICS.registry, port=settings.worker_metrics_port, bind=settings.metrics_bind, what="worker")
    _register(app, agent, settings)
    host_isolation = _isolate(agent, settings, cpu_slots)
    attempt_setup.GPU_MINORS.update({g.uuid: g.minor for g in agent.discovered if g.minor is not None})
    daemon = _mps_daemon(args.host, settings, host_isolation) if worker_state.HOST_GPUS > 0 else None
    agent.start()
    probe.start()
    exporter = ExportRunner(
        worker=f"{args.host}:{worker_state.WORKER_INCARNATION}",
        storage_dir=settings.resolved_storage_dir,
        isolation=host_isolation,
        storage_gid=settings.storage_gid,
    )
    exporter.start()
    try:
        consume(app, host=args.host, loglevel=args.loglevel)
        _drain(settings)
    finally:
        probe.stop()
        exporter.stop()
        agent.leave()
        host_isolation.close()
        if daemon is not None:
            daemon.stop()


def _settings(args: argparse.Namespace) -> Settings:
    """The process's settings, with ``--broker`` over ``KILN_BROKER_URL``, and its logging."""
    from core.settings import get_settings

    settings = get_settings()
    if args.broker:
        # The flag overrides KILN_BROKER_URL in this process's settings, before the Celery app is built from them.
        settings.broker_url = args.broker
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return settings


def _register(app: Celery, agent: HostAgent, settings: Settings) -> None:
    """Declare the host's queue, check the storage is this database's, and register the host (its GPUs)."""
    from core.db import session_scope
    from core.deployment import StorageOfAnotherDeployment, check_storage
    from workers import worker_state
    from workers.celery_app import declare_host_queue

    declare_host_queue(app, agent.name)  # before the scheduler can see the host (and dispatch to its queue)
    with session_scope() as db:
        try:  # before anything of this database's is written there
            check_storage(db, settings.resolved_storage_dir)
        except StorageOfAnotherDeployment as exc:
            log.error("%s", exc)
            raise SystemExit(2) from None
        worker_state.HOST_GPUS = len(agent.register(db).gpus)  # and ends the attempts a previous worker left behind
    worker_state.CURRENT_HOST = agent.name


def _isolate(agent: HostAgent, settings: Settings, cpu_slots: int) -> Isolation:
    """How this host isolates attempts, checked against this database's uid range and recorded on the host."""
    from core.db import session_scope
    from core.deployment import deployment_uid
    from workers import isolation

    host_isolation = isolation.configure(host=agent.name, settings=settings, host_slots=agent.slots or cpu_slots)
    log.info(host_isolation.describe())
    with session_scope() as db:
        clash = host_isolation.users.check_range(deployment_uid(db))
        if clash is not None:
            log.error("%s", clash)
            raise SystemExit(2)
        agent.record_isolation(db, host_isolation.mode, host_isolation.describe_sandbox())
    return host_isolation


def _mps_daemon(host: str, settings: Settings, host_isolation: Isolation) -> MpsDaemon | None:
    """A GPU host's MPS daemon, through which fractional jobs share GPUs (its state goes out with the heartbeat);
    None where it is off, not installed, or cannot serve a sandboxed client."""
    from workers import mps

    if host_isolation.sandbox is not None:
        # Measured on an H100 (2026-12-06): a client in the sandbox, as its team's uid, is refused by the control
        # daemon ("User did not send valid credentials", CUDA error 805) while the same uid outside connects; a
        # share would fail at its first CUDA call. Fail closed: no daemon, so the scheduler places no share here.
        log.warning(
            "MPS: not offered on a host that sandboxes attempts: an MPS client cannot connect from inside "
            "the sandbox yet (docs/security.md); GPU shares run only where KILN_ISOLATION=none"
        )
        return None
    daemon = mps.configure(
        settings.mps,
        settings.mps_control,
        settings.resolved_storage_dir / "mps" / host,
        for_team_users=host_isolation.users.enabled,
    )
    log.info("MPS: " + (f"daemon {daemon.state} ({daemon.control})" if daemon else "off or not installed: no shares"))
    return daemon


def _drain(settings: Settings) -> None:
    """A warm shutdown: the supervisions saw SHUTTING_DOWN and are stopping their trainers (checkpoint, exit
    PREEMPTED -> DRAINED, back to the queue with progress); wait for their reports before exiting."""
    from workers import worker_state

    if not worker_state.SUPERVISIONS.join(settings.drain_timeout_s):
        log.error(
            "%d attempts still running after %.0f s of shutdown; exiting",
            worker_state.SUPERVISIONS.running(),
            settings.drain_timeout_s,
        )


def consume(app: Celery, *, host: str, loglevel: str) -> None:
    """Run the Celery worker on the host's queue until a shutdown is asked for (SIGTERM, SIGINT): a worker that
    returns without one has lost its consumer (an unrecoverable error, e.g. kombu's on a broker crash) and is
    started again, in this process, while the supervision threads go on."""
    from workers import worker_state
    from workers.celery_app import host_queue

    while True:
        app.worker_main(
            [
                "worker",
                "--queues",
                host_queue(host),
                "--hostname",
                f"{host}@%h",
                "--pool",
                "threads",  # a task only claims; the attempts run in this process's supervision threads
                # A claim (milliseconds, one transaction), a redelivered copy of it and a consumer probe never wait for
                # one another. How many attempts share the host is the scheduler's decision, not Celery's.
                "--concurrency",
                "3",
                "--loglevel",
                loglevel,
                # Liveness is the host agent's heartbeat in PostgreSQL and the consumer probe; Celery's broadcast
                # chatter is not needed (and the embedded SQLAlchemy transport has no fanout exchange for it).
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
        if worker_state.SHUTTING_DOWN.is_set():
            return
        log.error(
            "the Celery consumer of %s stopped on its own; starting it again (%d attempts keep running)",
            host,
            worker_state.SUPERVISIONS.running(),
        )
        time.sleep(1.0)  # a broker still away: Celery's own start-up retries the connection from here


if __name__ == "__main__":
    main()
