"""``python -m workers --host NAME [--cpu-slots N] [--broker URL]``: one worker process per host.

It registers the host (and its GPUs through NVML; none -> CPU slots), starts the host agent's heartbeat, and
consumes the host's own queue with a thread pool: each running attempt is one thread supervising a torchrun.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket


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
    if args.broker:
        # Before anything reads the settings: the Celery app is built from them.
        os.environ["KILN_BROKER_URL"] = args.broker
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from core.db import session_scope
    from core.gpu_types import MPS_MAX_CLIENTS_PER_GPU
    from core.liveness import Pulse
    from core.settings import get_settings
    from workers import isolation, mps, tasks
    from workers.celery_app import declare_host_queue, get_app, host_queue
    from workers.host_agent import HostAgent
    from workers.inventory import detect_inventory

    settings = get_settings()
    inventory = detect_inventory()
    tasks.WORKER_INCARNATION = secrets.token_hex(6)
    cpu_slots = args.cpu_slots if args.cpu_slots is not None else max(1, (os.cpu_count() or 2) // 2)
    agent = HostAgent(name=args.host, inventory=inventory, cpu_slots=cpu_slots,
                      address=args.address or socket.gethostname(),
                      settings=settings,
                      incarnation=tasks.WORKER_INCARNATION,
                      pulse=Pulse(settings.liveness_file, settings.heartbeat_interval_s))  # fmt: skip
    app = get_app()
    declare_host_queue(app, args.host)  # before the scheduler can see the host (and dispatch to its queue)
    with session_scope() as db:
        has_gpus = bool(agent.register(db).gpus)  # and ends the attempts a previous worker process left behind
    daemon = None
    if has_gpus:  # fractional jobs share GPUs through the host's MPS daemon (its state goes out with the heartbeat)
        daemon = mps.configure(settings.mps, settings.mps_control, settings.resolved_storage_dir / "mps" / args.host)
        logging.getLogger("kiln.worker").info(
            "MPS: " + (f"daemon {daemon.state} ({daemon.control})" if daemon else "off or not installed: no shares")
        )
    tasks.CURRENT_HOST = args.host
    host_isolation = isolation.configure(host=args.host, settings=settings, host_slots=agent.slots or cpu_slots)
    logging.getLogger("kiln.worker").info(host_isolation.describe())
    os.environ["KILN_WORKER_HOST"] = args.host
    agent.start()

    # One thread per slot, plus one: a redelivered or refused message must never queue behind running attempts
    # (refusing takes milliseconds; the scheduler, not Celery, decides how many attempts share the host).
    concurrency = agent.slots * (MPS_MAX_CLIENTS_PER_GPU if daemon else 1) + 1
    try:
        app.worker_main([
            "worker",
            "--queues", host_queue(args.host),
            "--hostname", f"{args.host}@%h",
            "--pool", "threads",  # attempts are supervision loops around subprocesses: threads are enough
            "--concurrency", str(concurrency),
            "--loglevel", args.loglevel,
            # Liveness is the host agent's heartbeat in PostgreSQL; Celery's broadcast chatter is not needed
            # (and the embedded SQLAlchemy transport has no fanout exchange for it).
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ])  # fmt: skip
    finally:
        agent.stop()
        host_isolation.close()
        if daemon is not None:
            daemon.stop()


if __name__ == "__main__":
    main()
