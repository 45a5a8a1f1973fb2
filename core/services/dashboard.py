"""The dashboard's read-only views: tenancy (who sees which teams and jobs), the queue in scheduling order, one
job's overview, and the SLA each job is held to. A job, the job list, a job's timeline and its metrics are read
as ``/v1/jobs`` reads them (``core.services.jobs``, ``core.repositories.jobs``); the reads ``/v1`` has no use for
(queue order, contracts, aggregates) live in ``core.repositories.dashboard``."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from core.db import as_utc
from core.models import Attempt, Checkpoint, Event, Job, JobMetric, QosClass, SlaContract, Team
from core.queue_wait import breached_at, queued_seconds, waits_for_capacity
from core.repositories import dashboard as repo
from core.repositories import jobs as jobs_repo
from core.repositories import qos as qos_repo
from core.repositories import step_times
from core.repositories import teams as teams_repo
from core.services import jobs as jobs_svc
from core.services.errors import NotFound
from core.services.jobs import JobView
from core.services.ops_metrics import is_violation_event, violation_kind
from core.services.principal import Principal
from core.services.visibility import ACTIVE_STATES, FINISHED_STATES, team_filter, visible_team_ids
from core.states import JobState

# ---------------------------------------------------------------------------------------------------------------
# Tenancy (which teams are in view: core.services.visibility): another team's job is as absent as a missing one


def get_visible_job(db: Session, who: Principal, job_id: int) -> Job:
    job = jobs_repo.get(db, job_id)
    if job is None or not who.can_see(job.team_id):
        raise NotFound(f"job {job_id} not found")
    return job


def job_or_none(db: Session, job_id: int) -> Job | None:
    """The job, with no tenancy check: for a caller that checked it already (a stream's guard)."""
    return jobs_repo.get(db, job_id)


def visible_teams(db: Session, who: Principal) -> Sequence[Team]:
    return teams_repo.list_teams(db, visible_team_ids(db, who))


def qos_classes(db: Session) -> Sequence[QosClass]:
    return qos_repo.list_all(db)


# ---------------------------------------------------------------------------------------------------------------
# The SLA each job is held to


class WaitKey(NamedTuple):
    """What a job's maximum queue wait is looked up by."""

    job_id: int
    team_id: int
    qos_class_id: int
    spec: Mapping[str, Any] | str  # the spec, or its JSON text (parsed only when no contract of the job answers)


def _wait_key(j: Job) -> WaitKey:
    return WaitKey(j.id, j.team_id, j.qos_class_id, j.spec or {})


def _wait_key_of_view(v: JobView, team_ids: Mapping[str, int], qos_ids: Mapping[str, int]) -> WaitKey:
    """A row of the job list: its team and class by name (the page's own teams and the classes, looked up once)."""
    return WaitKey(v.id, team_ids.get(v.team, -1), qos_ids.get(v.qos, -1), v.spec_json)


def effective_max_wait(db: Session, jobs: Sequence[Job], qos_by_id: Mapping[int, QosClass]) -> dict[int, float | None]:
    """The contract's maximum queue wait of each job: its own contract, its spec, the team's, the QoS default."""
    return _max_waits(db, [_wait_key(j) for j in jobs], qos_by_id)


def _max_waits(db: Session, jobs: Sequence[WaitKey], qos_by_id: Mapping[int, QosClass]) -> dict[int, float | None]:
    if not jobs:
        return {}
    own = {c.job_id: c.max_queue_wait_s for c in repo.job_contracts(db, [j.job_id for j in jobs])}
    team_default = {
        c.team_id: c.max_queue_wait_s for c in repo.team_default_contracts(db, sorted({j.team_id for j in jobs}))
    }
    out: dict[int, float | None] = {}
    for j in jobs:
        # the first that says one; the spec is parsed only when the job's own contract says none
        found = own.get(j.job_id)
        if found is None:
            found = _spec_wait(j.spec)
        if found is None:
            found = team_default.get(j.team_id)
        if found is None:
            qos = qos_by_id.get(j.qos_class_id)
            found = qos.default_max_queue_wait_s if qos else None
        out[j.job_id] = None if found is None else float(found)
    return out


def _spec_wait(spec: Mapping[str, Any] | str) -> Any:
    data = json.loads(spec) if isinstance(spec, str) else spec
    return ((data or {}).get("sla") or {}).get("max_queue_wait_s")


@dataclass(frozen=True)
class JobSla:
    """A job, and why it missed its SLA (no reasons: it met it)."""

    job: Job
    team: str
    qos: str
    reasons: list[dict[str, str | None]]
    # It ran and its step time was never compared (a script that reports no steps, or steps too few or too brief
    # for a baseline and a recent window: core.repositories.step_times), or it ran as a best-effort GPU share (no
    # speed is promised to it): its step-time term is unmeasured, not met.
    unmeasured: bool = False


def sla_of_jobs_since(db: Session, who: Principal, *, team: str | None, since: datetime, now: datetime) -> list[JobSla]:
    """The jobs of the teams in view submitted since ``since``. A job attains its SLA unless it waited longer than
    its contract's maximum queue wait or the SLA evaluator recorded a violation event (``SLA_*VIOLATION*``) on it."""
    teams = team_filter(db, who, team)
    qos_by_id = {q.id: q for q in qos_repo.list_all(db)}
    team_names = teams_repo.names_by_id(db, teams)
    jobs = repo.jobs_submitted_since(db, team_ids=teams, since=since)
    max_waits = effective_max_wait(db, jobs, qos_by_id)
    violation_events: dict[int, list[Event]] = defaultdict(list)
    for e in repo.sla_events_since(db, team_ids=teams, since=since):
        if e.job_id is not None and is_violation_event(e.type):
            violation_events[e.job_id].append(e)
    started = [j.id for j in jobs if j.started_at is not None]
    measured = step_times.measured_jobs(db, started) - jobs_repo.best_effort_shares(db, started)
    out = []
    for j in jobs:
        waited = queued_seconds(j, now)
        limit = max_waits.get(j.id)
        reasons: list[dict[str, str | None]] = []
        if limit is not None and waited > limit and not waits_for_capacity(j):
            at = breached_at(j, limit) or _recorded_breach(violation_events.get(j.id, []))
            reasons.append(
                {
                    "type": "QUEUE_WAIT",
                    "message": f"waited {waited:.0f}s in the queue > {limit:.0f}s",
                    "at": at.isoformat() if at is not None else None,
                }
            )
        # The evaluator's queue-wait event says the wait when it noticed the breach (601 s); the wait counted above
        # is the whole of it (622 s), dated by that event: one queue-wait row per job, not two that disagree.
        queue_wait_said = bool(reasons)
        for e in violation_events.get(j.id, []):
            if _is_queue_wait(e):
                if queue_wait_said:
                    continue
                queue_wait_said = True
            reasons.append({"type": e.type, "message": e.message, "at": e.created_at.isoformat()})
        qos = qos_by_id.get(j.qos_class_id)
        unmeasured = j.started_at is not None and j.id not in measured
        out.append(JobSla(j, team_names.get(j.team_id, "?"), qos.name if qos else "?", reasons, unmeasured))
    return out


def _is_queue_wait(e: Event) -> bool:
    return violation_kind(e.type, (e.data or {}).get("kind")) == "queue_wait"


def _recorded_breach(events: list[Event]) -> datetime | None:
    """When the SLA evaluator saw a job's queue wait break: the breach it computed while the job waited, else the
    time of its event (the first cycle after the breach, while the scheduler runs). For a job admitted since, the
    wait it is in no longer tells."""
    for e in events:
        if _is_queue_wait(e):
            at = (e.data or {}).get("breached_at")
            return datetime.fromisoformat(at) if isinstance(at, str) else e.created_at
    return None


# ---------------------------------------------------------------------------------------------------------------
# The queue


@dataclass(frozen=True)
class QueueSlice:
    """One page of the queue. ``waiting``: each QUEUED job with its position (the queue-order read, which ``/v1``
    has no list of); ``listed``: the active or finished jobs, read by the job list ``/v1/jobs`` answers. Then what
    the rows show: names, and each job's maximum queue wait."""

    waiting: list[tuple[Job, int]]
    listed: list[JobView]
    more: bool
    total: int
    team_names: dict[int, str]
    qos_by_id: dict[int, QosClass]
    max_waits: dict[int, float | None]


def queue_page(
    db: Session,
    who: Principal,
    *,
    view: str,
    team: str | None,
    qos: str | None,
    after: int | None,
    limit: int,
    submitted_after: datetime | None = None,
) -> QueueSlice:
    """``waiting``: QUEUED jobs in the scheduler's base order, ``after`` a position; ``active``:
    admitted/running/preempting/paused (and LOST, about to be requeued); ``finished``: newest first, ``after``
    an id (keyset pagination). ``submitted_after``: only jobs submitted then or later (positions stay the
    whole queue's)."""
    teams = team_filter(db, who, team)
    submitted_after = as_utc(submitted_after)
    qos_by_id = {q.id: q for q in qos_repo.list_all(db)}
    qos_id = None
    if qos is not None:
        qos_id = next((q.id for q in qos_by_id.values() if q.name == qos), None)
        if qos_id is None:
            raise NotFound(f"QoS class {qos!r} not found")
    team_names = teams_repo.names_by_id(db, teams)
    waiting: list[tuple[Job, int]] = []
    listed: list[JobView] = []
    if view == "waiting":
        waiting, total = repo.waiting_page(
            db, team_ids=teams, qos_class_id=qos_id, after_pos=after, limit=limit + 1, submitted_after=submitted_after
        )
        more, waiting = len(waiting) > limit, waiting[:limit]
        keys = [_wait_key(j) for j, _ in waiting]
    else:
        states = (*ACTIVE_STATES, JobState.LOST.value) if view == "active" else FINISHED_STATES
        page = jobs_svc.list_jobs(
            db=db,
            principal=who,
            team=team,
            states=states,
            qos=qos,
            limit=limit,
            before_id=after or None,
            submitted_after=submitted_after,
        )
        listed, more = page.items, page.next_before_id is not None
        total = repo.count_jobs_in(
            db, team_ids=teams, qos_class_id=qos_id, states=states, submitted_after=submitted_after
        )
        team_ids = {name: tid for tid, name in team_names.items()}
        qos_ids = {q.name: q.id for q in qos_by_id.values()}
        keys = [_wait_key_of_view(v, team_ids, qos_ids) for v in listed]
    max_waits = _max_waits(db, keys, qos_by_id)
    return QueueSlice(waiting, listed, more, total, team_names, qos_by_id, max_waits)


def queue_groups(db: Session, who: Principal) -> tuple[Sequence[tuple[Any, ...]], list[tuple[str | None, int]]]:
    """Waiting and active jobs of the teams in view by (team, QoS, state), and the waiting ones by reason."""
    teams = visible_team_ids(db, who)
    groups = repo.queue_groups(db, team_ids=teams, states=(JobState.QUEUED.value, *ACTIVE_STATES))
    return groups, repo.pending_reason_counts(db, team_ids=teams)


# ---------------------------------------------------------------------------------------------------------------
# One job


@dataclass(frozen=True)
class JobOverview:
    job: Job
    team: Team | None
    qos: QosClass | None
    max_wait_s: float | None
    contract: SlaContract | None
    attempts: list[Attempt]
    checkpoints: Sequence[Checkpoint]
    events: list[Event]


def job_overview(db: Session, job: Job) -> JobOverview:
    qos_by_id = {q.id: q for q in qos_repo.list_all(db)}
    return JobOverview(
        job=job,
        team=teams_repo.get_by_id(db, job.team_id),
        qos=qos_by_id.get(job.qos_class_id),
        max_wait_s=effective_max_wait(db, [job], qos_by_id).get(job.id),
        contract=jobs_repo.effective_sla(db, job.id),
        attempts=list(jobs_repo.attempts(db, job.id)),
        checkpoints=jobs_repo.checkpoints(db, job.id),
        events=all_events(db, job.id),
    )


EVENTS_PER_READ = 10_000


def all_events(db: Session, job_id: int) -> list[Event]:
    """The job's whole timeline, oldest first: the read ``/v1/jobs/{id}/events`` pages with, page after page."""
    out: list[Event] = []
    while True:
        rows = jobs_repo.events(db, job_id=job_id, after_id=out[-1].id if out else 0, limit=EVENTS_PER_READ)
        out.extend(e for e, _actor in rows)
        if len(rows) < EVENTS_PER_READ:
            return out


def metrics_after(db: Session, job_id: int, after_id: int, limit: int) -> Sequence[JobMetric]:
    return jobs_repo.metrics_after_id(db, job_id=job_id, after_id=after_id, limit=limit)


def job_fingerprint(db: Session, job: Job) -> tuple[Any, ...]:
    """Changes whenever the job's overview would: its state, its row, its events, its checkpoints."""
    return (job.state, job.updated_at, job.last_step, *repo.job_change_marks(db, job.id))
