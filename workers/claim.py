"""Claim one node of an attempt under its fencing token: exactly one delivery per (attempt, node) wins.

Every write about the job happens in a transaction that first locks the job row and checks that the job's
fencing token is still this attempt's; a delivery or a worker that lost its token changes nothing but its own
attempt row. This is what makes Redis redelivery harmless and "no job runs twice" true.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.db import session_scope, utcnow
from core.deployment import deployment_uid
from core.event_types import EventType
from core.fence import lease_clock
from core.lifecycle import end_attempt, renew_lease, stop_cause
from core.models import GPU, Attempt, Host, Job, QosClass, Team, Usage
from core.services import datasets as datasets_svc
from core.settings import Settings
from core.states import ATTEMPT_LIVE, AttemptState, JobState
from core.transitions import move_attempt, record_event, transition
from workers import isolation, worker_state
from workers.claimed import Claimed
from workers.supervisor import Rendezvous

log = logging.getLogger(__name__)

RDZV_PORT_SPAN = 20000  # gang jobs: node 0's c10d store listens on settings.rendezvous_port_base + id % span


class Refused(Exception):
    """This delivery may not run the attempt (stale token, already claimed, job gone)."""


def _lock_attempt_and_job(db: Session, attempt_id: int) -> tuple[Attempt | None, Job | None]:
    # The job row first (the reconciler and the scheduler lock in the same order), then the attempt.
    job_id = db.scalar(select(Attempt.job_id).where(Attempt.id == attempt_id))
    if job_id is None:
        return None, None
    job = db.get(Job, job_id, with_for_update=True, populate_existing=True)
    # SQLite ignores FOR UPDATE; touching the row first takes its write lock there too, so two deliveries
    # racing on the embedded default serialise here as they do on PostgreSQL.
    db.execute(update(Attempt).where(Attempt.id == attempt_id).values(number=Attempt.number))
    attempt = db.get(Attempt, attempt_id, with_for_update=True, populate_existing=True)
    return attempt, job


def _why_refused(attempt: Attempt, job: Job, *, token: int, node_rank: int, host: str) -> str | None:
    """Why this delivery may not start node ``node_rank`` of ``attempt`` on ``host``, or None when it may."""
    if attempt.fencing_token != token or job.fencing_token != token:
        return f"stale fencing token {token} (current {job.fencing_token})"
    if attempt.state not in ATTEMPT_LIVE:
        return f"attempt already ended ({attempt.state})"
    placement = attempt.placement or []
    if not 0 <= node_rank < len(placement):
        return f"node_rank {node_rank} is not in the placement"
    node = placement[node_rank]
    if node.get("host") != host:
        return f"node {node_rank} is placed on {node.get('host')}, not on {host}"
    if node.get("claimed_by"):
        return f"node {node_rank} already started by delivery {node['claimed_by']}"
    if job.state not in (JobState.ADMITTED, JobState.RUNNING):
        return f"job is {job.state}"
    return None


def _start_node(
    db: Session,
    *,
    job: Job,
    attempt: Attempt,
    placement: list[dict[str, Any]],
    node_rank: int,
    host: str,
    token: int,
    delivery: str,
    now: datetime,
    settings: Settings,
) -> None:
    """Mark the node claimed by this delivery and worker, and the attempt and the job running."""
    node = placement[node_rank]
    node["claimed_by"] = delivery
    node["claimed_at"] = now.isoformat()
    node["worker"] = worker_state.WORKER_INCARNATION
    attempt.placement = placement  # a new list, so the JSON column is written
    if attempt.state == AttemptState.PENDING:
        move_attempt(attempt, AttemptState.RUNNING)
        attempt.started_at = now
    renew_lease(attempt, node_rank=node_rank, now=now, lease_s=settings.lease_s)
    host_isolation = isolation.current(host, settings)
    if host_isolation.mode != "sandbox":  # the operator turned it off, or a kiln recipe on a host that cannot
        record_event(
            db,
            EventType.UNSANDBOXED,
            job=job,
            message=f"attempt {attempt.number} runs without a sandbox on {host}: {host_isolation.describe_sandbox()}",
            data={"attempt": attempt.number, "host": host},
        )
    if job.state == JobState.ADMITTED:
        transition(
            db,
            job,
            JobState.RUNNING,
            message=f"attempt {attempt.number} started on {host}",
            data={"attempt": attempt.number, "host": host, "token": token},
        )


def _account_usage(
    db: Session, *, job: Job, attempt: Attempt, placement: list[dict[str, Any]], gpus: list[GPU], now: datetime
) -> None:
    """Node 0 accounts for the whole placement (one usage row per attempt)."""
    if db.scalar(select(Usage.id).where(Usage.attempt_id == attempt.id)) is not None:
        return
    all_gpus = [u for n in placement for u in n.get("gpus") or []]
    gpu_type = gpus[0].model if gpus else "cpu"
    units = len(all_gpus) if all_gpus else sum(int(n.get("slots") or 1) for n in placement)
    db.add(
        Usage(
            team_id=job.team_id,
            job_id=job.id,
            attempt_id=attempt.id,
            gpu_type=gpu_type,
            gpus=units,
            gpu_seconds=0.0,
            started_at=now,
        )
    )


def _rendezvous(
    db: Session, *, job: Job, attempt: Attempt, placement: list[dict[str, Any]], node_rank: int, settings: Settings
) -> Rendezvous | None:
    """A gang's rendezvous: node 0's c10d store, on its address; None for a single node."""
    if len(placement) <= 1:
        return None
    head = placement[0]
    head_host = db.scalars(select(Host).where(Host.name == head.get("host"))).first()
    address = head.get("address") or (head_host.address if head_host and head_host.address else head["host"])
    port = settings.rendezvous_port_base + attempt.id % RDZV_PORT_SPAN
    return Rendezvous(
        nnodes=len(placement),
        node_rank=node_rank,
        endpoint=f"{address}:{port}",
        run_id=f"kiln-{job.id}-{attempt.number}",
    )


def _claimed(
    db: Session,
    *,
    job: Job,
    attempt: Attempt,
    placement: list[dict[str, Any]],
    node_rank: int,
    host: str,
    now: datetime,
    settings: Settings,
) -> Claimed:
    """What the worker holds of the node it claimed, read in the claim's transaction (node 0 accounts usage)."""
    node = placement[node_rank]
    gpus = list(db.scalars(select(GPU).where(GPU.uuid.in_(node.get("gpus") or []))).all())
    gpus.sort(key=lambda g: (node.get("gpus") or []).index(g.uuid))
    host_row = db.scalars(select(Host).where(Host.name == host)).first()
    qos = db.get(QosClass, job.qos_class_id)
    if node_rank == 0:
        _account_usage(db, job=job, attempt=attempt, placement=placement, gpus=gpus, now=now)
    rendezvous = _rendezvous(db, job=job, attempt=attempt, placement=placement, node_rank=node_rank, settings=settings)
    names = [str(n) for n in (job.spec or {}).get("datasets") or []]
    team = db.get(Team, job.team_id)
    return Claimed(
        job_id=job.id,
        team_id=job.team_id,
        attempt_number=attempt.number,
        spec=dict(job.spec or {}),
        placement=placement,
        gpus=gpus,
        qos=qos,
        host_links=dict(host_row.links or {}) if host_row else {},
        rendezvous=rendezvous,
        ran_before_s=job.ran_s(now, besides=attempt.id),
        team=team.name if team is not None else "",
        address=host_row.address if host_row is not None else None,
        datasets=datasets_svc.paths_for(db, team_id=job.team_id, names=names),
        deployment=deployment_uid(db),
    )


def claim(
    db: Session, *, attempt_id: int, token: int, node_rank: int, host: str, delivery: str, settings: Settings
) -> Claimed:
    """Exactly one delivery per (attempt, node) wins; the others raise Refused (and leave an event)."""
    now = utcnow()
    attempt, job = _lock_attempt_and_job(db, attempt_id)
    if attempt is None or job is None:
        raise Refused(f"attempt {attempt_id} does not exist")
    why = _why_refused(attempt, job, token=token, node_rank=node_rank, host=host)
    if why is not None:
        record_event(
            db,
            EventType.DELIVERY_REFUSED,
            job=job,
            message=f"delivery of attempt {attempt.number} refused: {why}",
            data={
                "attempt_id": attempt.id,
                "token": token,
                "current_token": job.fencing_token,
                "node_rank": node_rank,
                "host": host,
                "delivery": delivery,
                "reason": why,
            },
        )
        raise Refused(why)
    if job.cancel_requested:
        why = f"{stop_cause(job)}, before it started"
        job.exit_reason = why[:512]
        transition(db, job, JobState.CANCELLED, message=why, data={"attempt": attempt.number})
        end_attempt(db, attempt, state=AttemptState.CANCELLED, reason=why, now=now)
        raise Refused(why)
    placement = [dict(n) for n in attempt.placement or []]
    _start_node(
        db,
        job=job,
        attempt=attempt,
        placement=placement,
        node_rank=node_rank,
        host=host,
        token=token,
        delivery=delivery,
        now=now,
        settings=settings,
    )
    return _claimed(
        db, job=job, attempt=attempt, placement=placement, node_rank=node_rank, host=host, now=now, settings=settings
    )


def claim_delivery(
    *, attempt_id: int, fencing_token: int, node_rank: int, host: str, delivery: str, settings: Settings
) -> tuple[Claimed, float] | None:
    """Claim in its own committed transaction: the claim and the lease clock read before it, or None if refused."""
    refused: Refused | None = None
    isolation.current(host, settings)  # detected (a probe process) before the claim's transaction, never in it
    claimed_at = lease_clock()  # before the claim's transaction: the lease file never outlasts its lease
    with session_scope() as db:
        try:
            claimed = claim(
                db,
                attempt_id=attempt_id,
                token=fencing_token,
                node_rank=node_rank,
                host=host,
                delivery=delivery,
                settings=settings,
            )
        except Refused as exc:
            refused = exc  # caught inside the transaction: the refusal's event (or cancel) is committed
    if refused is not None:
        log.warning("attempt %s node %s refused on %s: %s", attempt_id, node_rank, host, refused)
        return None
    return claimed, claimed_at
