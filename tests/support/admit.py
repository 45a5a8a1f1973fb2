"""Admission for the worker tests, exactly as the scheduler does it (issue 5's contract), plus a small loop.

The real scheduler (``scheduler/``) owns the policy; these tests need only "put this job on that host" and
"requeue and place again after a failure", so this module does the same writes in the same transaction:
bump ``job.fencing_token``, create the Attempt with its placement, QUEUED -> ADMITTED, commit, then
``dispatch_attempt``. The loop also runs the real reconciler each cycle, as ``scheduler/loop.py`` does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.db import utcnow
from core.models import Attempt, Event, Host, Job, QosClass, SlaContract, Team
from core.settings import Settings
from core.spec import parse_spec_data
from core.states import ACTIVE, JobState, record_event, transition
from scheduler.reconciler import reconcile
from workers.dispatch import dispatch_attempt

log = logging.getLogger(__name__)


def submit(
    db: Session, spec: dict[str, Any], *, max_restarts: int = 3, recovery_objective_s: float = 60.0,
    checkpoint_interval_s: float = 600.0,
) -> Job:
    """A QUEUED job with its effective SLA contract (what the API's submit writes)."""
    parsed = parse_spec_data(spec)
    team = db.scalars(select(Team).where(Team.name == parsed.team)).first()
    if team is None:
        team = Team(name=parsed.team)
        db.add(team)
        db.flush()
    qos = db.scalars(select(QosClass).where(QosClass.name == (parsed.sla.qos or "silver"))).one()
    job = Job(name=parsed.name, team_id=team.id, spec=parsed.model_dump(mode="json"), state="QUEUED",
              qos_class_id=qos.id, gpus=parsed.resources.gpus, gpu_type=parsed.resources.gpu_type)  # fmt: skip
    db.add(job)
    db.flush()
    db.add(SlaContract(team_id=team.id, job_id=job.id, qos_class_id=qos.id, max_restarts=max_restarts,
                       recovery_time_objective_s=recovery_objective_s,
                       checkpoint_interval_s=checkpoint_interval_s))  # fmt: skip
    record_event(db, "SUBMITTED", job=job, message="submitted")
    return job


def admit(db: Session, job: Job, host: Host, *, slots: int | None = None) -> Attempt:
    """The scheduler's admission of one single-node job onto ``host`` (CPU slots or all of its GPUs)."""
    n = slots or (job.spec.get("resources") or {}).get("cpu_slots") or 1
    gpus = [g.uuid for g in host.gpus][: job.gpus] if job.gpus else []
    job.fencing_token += 1
    number = (db.scalar(select(func.max(Attempt.number)).where(Attempt.job_id == job.id)) or 0) + 1
    attempt = Attempt(job_id=job.id, number=number, fencing_token=job.fencing_token, state="PENDING",
                      placement=[{"host": host.name, "queue": host.queue, "gpus": gpus, "slots": n,
                                  "node_rank": 0}])  # fmt: skip
    db.add(attempt)
    db.flush()
    job.not_before = None
    transition(db, job, JobState.ADMITTED, message=f"admitted on {host.name}",
               data={"attempt": number, "hosts": [host.name], "token": job.fencing_token})  # fmt: skip
    return attempt


def _free_slots(db: Session, host: Host) -> int:
    used = 0
    rows = db.execute(
        select(Attempt.placement)
        .join(Job, (Job.id == Attempt.job_id) & (Job.fencing_token == Attempt.fencing_token))
        .where(Job.state.in_([s.value for s in ACTIVE]))
    ).scalars()
    for placement in rows:
        for node in placement or []:
            if node.get("host") == host.name:
                used += int(node.get("slots") or 1)
    return host.cpu_slots - used


def _avoid(db: Session, job: Job) -> set[str]:
    """Hosts of the job's last attempt when it was lost: restart elsewhere if there is anywhere else."""
    ev = db.scalars(
        select(Event).where(Event.job_id == job.id, Event.type == "QUEUED").order_by(Event.id.desc()).limit(1)
    ).first()
    return set((ev.data or {}).get("avoid_hosts") or []) if ev is not None else set()


class MiniScheduler:
    """Reconcile, then place QUEUED jobs (after their backoff) on UP hosts with free slots, every ``interval_s``."""

    def __init__(self, maker: sessionmaker[Session], settings: Settings, *, interval_s: float = 0.5,
                 place: bool = True, on_cycle: Callable[[list[str]], None] | None = None):  # fmt: skip
        self.maker = maker
        self.settings = settings
        self.interval_s = interval_s
        self.place = place
        self.on_cycle = on_cycle
        self.actions: list[str] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mini-scheduler", daemon=True)

    def cycle(self) -> list[str]:
        now = utcnow()
        to_dispatch: list[tuple[int, int, list[dict[str, Any]]]] = []
        with self.maker() as db:
            actions = reconcile(db=db, now=now, settings=self.settings)
            if self.place:
                queued = db.scalars(
                    select(Job).where(Job.state == "QUEUED").order_by(Job.id).with_for_update(skip_locked=True)
                ).all()
                for job in queued:
                    if job.cancel_requested or (job.not_before is not None and job.not_before > now):
                        continue
                    hosts = db.scalars(select(Host).where(Host.state == "UP").order_by(Host.name)).all()
                    avoid = _avoid(db, job)
                    hosts = sorted(hosts, key=lambda h: h.name in avoid)
                    need = (job.spec.get("resources") or {}).get("cpu_slots") or 1
                    for host in hosts:
                        fresh = host.last_heartbeat_at and host.last_heartbeat_at > now - timedelta(seconds=30)
                        if fresh and _free_slots(db, host) >= need:
                            attempt = admit(db, job, host)
                            to_dispatch.append((attempt.id, attempt.fencing_token, attempt.placement))
                            actions.append(f"job {job.id}: admitted on {host.name} (attempt {attempt.number})")
                            break
            db.commit()
        for attempt_id, token, placement in to_dispatch:
            try:
                dispatch_attempt(attempt_id, token, placement)
            except Exception:  # the broker is away: the reconciler re-dispatches after the pickup timeout
                log.exception("dispatch failed")
        return actions

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                actions = self.cycle()
                self.actions += actions
                if self.on_cycle is not None:
                    self.on_cycle(actions)
            except Exception as exc:  # the database is restarting: try again next cycle
                self.errors += 1
                log.warning("scheduler cycle failed: %s", exc)
            self._stop.wait(self.interval_s)

    def start(self) -> MiniScheduler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
