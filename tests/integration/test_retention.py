"""Retention on PostgreSQL: a finished job's per-step metrics are thinned then deleted, its events pruned (except
those /metrics counts for all time), old deliveries and log directories go; a job still running keeps all."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Event, Job, JobMetric, QosClass, Team, Webhook, WebhookDelivery
from core.retention import prune_database, prune_job_files, prune_local_tier
from core.settings import Settings

pytestmark = pytest.mark.integration

SETTINGS = Settings(
    retention_metrics_downsample_days=7,
    retention_metric_points=100,
    retention_metrics_days=90,
    retention_events_days=180,
    retention_logs_days=30,
    retention_deliveries_days=30,
)
EVENT_TYPES = (
    "SUBMITTED",
    "ADMITTED",
    "RUNNING",
    "CHECKPOINT",
    "PREEMPTING",
    "QUEUED",
    "RECOVERED",
    "SLA_STEP_TIME_VIOLATION",
    "COMPILE_OK",
    "COMPILE_CACHE_REJECTED",
    "COMPILE_CACHE_PUBLISHED",
    "SUCCEEDED",
)


def _job(db: Session, team: Team, *, state: str, finished_days_ago: float | None, now: datetime, steps: int) -> Job:
    qos = db.scalars(select(QosClass)).first()
    assert qos is not None
    finished = now - timedelta(days=finished_days_ago) if finished_days_ago is not None else None
    job = Job(name="j", team_id=team.id, spec={}, qos_class_id=qos.id, state=state, finished_at=finished)
    db.add(job)
    db.flush()
    db.add_all(JobMetric(job_id=job.id, step=s, loss=1.0 / (s + 1)) for s in range(1, steps + 1))
    db.add_all(Event(job_id=job.id, team_id=team.id, type=t, message=t) for t in EVENT_TYPES)
    db.flush()
    return job


def _metrics(db: Session, job: Job) -> list[int]:
    return list(db.scalars(select(JobMetric.step).where(JobMetric.job_id == job.id).order_by(JobMetric.step)).all())


def _events(db: Session, job: Job) -> set[str]:
    return set(db.scalars(select(Event.type).where(Event.job_id == job.id)).all())


def test_retention_by_age(db: Session, tmp_path: Path) -> None:
    now = utcnow()
    team = Team(name="keep")
    db.add(team)
    db.flush()
    ancient = _job(db, team, state="SUCCEEDED", finished_days_ago=200, now=now, steps=50)
    old = _job(db, team, state="FAILED", finished_days_ago=10, now=now, steps=1000)
    recent = _job(db, team, state="SUCCEEDED", finished_days_ago=1, now=now, steps=300)
    running = _job(db, team, state="RUNNING", finished_days_ago=None, now=now, steps=1000)
    hook = Webhook(team_id=team.id, url="http://127.0.0.1:9/", secret="s", events=["failed"])
    db.add(hook)
    db.flush()
    sent = now - timedelta(days=40)
    db.add_all(
        [
            WebhookDelivery(
                webhook_id=hook.id, kind="failed", payload={}, status="delivered", delivered_at=sent, created_at=sent
            ),
            WebhookDelivery(webhook_id=hook.id, kind="failed", payload={}, status="pending", created_at=sent),
        ]
    )
    db.flush()

    report = prune_database(db, SETTINGS, now)

    assert _metrics(db, ancient) == []  # past metrics_days
    thinned = _metrics(db, old)
    assert len(thinned) <= 100 and thinned[0] == 1 and thinned[-1] == 1000  # evenly, the last kept
    gaps = {b - a for a, b in zip(thinned, thinned[1:], strict=False)}
    assert len(gaps - {max(gaps)}) <= 1, gaps  # one stride (and the last step's own gap)
    assert len(_metrics(db, recent)) == 300 and len(_metrics(db, running)) == 1000
    counted = {"PREEMPTING", "QUEUED", "RECOVERED", "SLA_STEP_TIME_VIOLATION", "COMPILE_OK", "COMPILE_CACHE_REJECTED"}
    assert _events(db, ancient) == counted  # what /metrics counts for all time
    assert _events(db, old) == set(EVENT_TYPES) and _events(db, running) == set(EVENT_TYPES)
    statuses = db.scalars(select(WebhookDelivery.status).where(WebhookDelivery.webhook_id == hook.id)).all()
    assert list(statuses) == ["pending"]  # a pending one is never dropped
    assert (report.metrics_deleted, report.metrics_thinned, report.events_deleted, report.deliveries_deleted) == (
        50,
        1000 - len(thinned),
        len(EVENT_TYPES) - len(counted),
        1,
    )

    again = prune_database(db, SETTINGS, now)  # idempotent
    assert not again and _metrics(db, old) == thinned

    # Log and run directories: only the long-finished job's go.
    for job in (ancient, old, recent, running):
        for kind in ("logs", "runs"):
            (tmp_path / kind / str(job.id)).mkdir(parents=True)
            (tmp_path / kind / str(job.id) / "1.log").write_text("x")
    assert prune_job_files(db, tmp_path, SETTINGS, now) == 2
    left = {int(p.name) for p in (tmp_path / "logs").iterdir()}
    assert left == {old.id, recent.id, running.id}


def test_the_local_tier_keeps_only_the_checkpoints_of_jobs_that_may_still_resume(db: Session, tmp_path: Path) -> None:
    """A host's local tier is memory: a job that ended, however recently, never resumes from it (before, every
    finished job left up to ``keep_last`` checkpoints of its model in /dev/shm for good)."""
    now = utcnow()
    team = db.scalars(select(Team)).first() or Team(name="tier")
    db.add(team)
    db.flush()
    done = _job(db, team, state="SUCCEEDED", finished_days_ago=0.01, now=now, steps=0)
    failed = _job(db, team, state="FAILED", finished_days_ago=0.01, now=now, steps=0)
    waiting = _job(db, team, state="QUEUED", finished_days_ago=None, now=now, steps=0)  # preempted: resumes
    running = _job(db, team, state="RUNNING", finished_days_ago=None, now=now, steps=0)
    jobs_dir = tmp_path / "shm" / "uid" / "jobs"
    gone = 10**9  # a job this database no longer has
    for job_id in (done.id, failed.id, waiting.id, running.id, gone):
        (jobs_dir / str(job_id) / "step_00000100").mkdir(parents=True)
    (jobs_dir / "not-a-job").mkdir()
    assert prune_local_tier(db, jobs_dir) == 3
    assert {p.name for p in jobs_dir.iterdir()} == {str(waiting.id), str(running.id), "not-a-job"}
    assert prune_local_tier(db, tmp_path / "none") == 0


def test_zero_turns_pruning_off(db: Session) -> None:
    now = utcnow()
    team = Team(name="forever")
    db.add(team)
    db.flush()
    job = _job(db, team, state="SUCCEEDED", finished_days_ago=1000, now=now, steps=20)
    off = Settings(
        retention_metrics_downsample_days=0,
        retention_metrics_days=0,
        retention_events_days=0,
        retention_deliveries_days=0,
        retention_logs_days=0,
    )
    assert not prune_database(db, off, now)
    assert db.scalar(select(func.count()).select_from(JobMetric).where(JobMetric.job_id == job.id)) == 20
