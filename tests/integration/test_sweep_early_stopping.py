"""A sweep's median stopping rule, applied where the worker relays an evaluation: a job worse than the median of
the sweep's other jobs at the same step is asked to stop in the same heartbeat and ends CANCELLED, saying why."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.lifecycle import ExitClass
from core.models import Attempt, Event, Job
from core.settings import Settings
from core.sweeps.service import submit_sweep
from core.transitions import record_event
from harness.workers_cluster import admit, cluster_admin, submit, tiny_spec
from workers.claim import claim
from workers.exit_classes import Outcome
from workers.host_agent import HostAgent
from workers.inventory import NoGpus
from workers.runner import AttemptRunner
from workers.supervisor import TrainerProcess
from workers.telemetry_relay import RelayState, relay

pytestmark = pytest.mark.integration

SETTINGS = Settings(lease_s=10.0, heartbeat_interval_s=1.0)


def sweep_of(db: Session, n: int, **early_stopping: Any) -> list[Job]:
    """A sweep of ``n`` jobs ranked by accuracy (highest first) with the median rule; its jobs, by id."""
    submit(db, tiny_spec("quota-for-the-team"))  # the team's CPU quota, as the cluster's admin sets it
    sweep = {
        "list": [{"lr": 0.001 * (i + 1)} for i in range(n)],
        "early_stopping": early_stopping,
        "objective": {"metric": "accuracy", "goal": "maximize"},
    }
    doc = {**tiny_spec("search", steps=60), "sweep": sweep}
    view = submit_sweep(db=db, principal=cluster_admin(db), document=doc)
    return sorted(view.jobs, key=lambda j: j.id)


def evaluated(db: Session, job: Job, step: int, accuracy: float) -> None:
    """What the relay records when a job's code reports an evaluation (as other jobs of the sweep did)."""
    record_event(
        db, "EVALUATION", job=job, message=f"step {step}", data={"step": step, "metrics": {"accuracy": accuracy}}
    )


def running(db: Session, job: Job, tmp_path: Path) -> AttemptRunner:
    host = HostAgent(
        name=f"es-{job.id}", inventory=NoGpus(), cpu_slots=2, address="127.0.0.1", settings=SETTINGS
    ).register(db)
    db.flush()
    attempt = admit(db, job, host)
    claimed = claim(
        db,
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        delivery="d1",
        settings=SETTINGS,
    )
    proc = TrainerProcess([], env={}, log_path=tmp_path / "1.log", run_dir=tmp_path / "run", cwd=tmp_path)
    return AttemptRunner(
        attempt_id=attempt.id,
        token=attempt.fencing_token,
        node_rank=0,
        host=host.name,
        settings=SETTINGS,
        claimed=claimed,
        proc=proc,
    )


def report_eval(
    db: Session,
    job: Job,
    runner: AttemptRunner,
    step: int,
    accuracy: float,
    *,
    running: bool = True,
    done: bool = False,
) -> None:
    """A heartbeat relaying the evaluation (``running=False``: the report after the trainer exited; ``done``: the
    trainer's last record came with it)."""
    attempt = db.get(Attempt, runner.attempt_id)
    assert attempt is not None
    records = [{"kind": "eval", "rank": 0, "ts": time.time(), "step": step, "metrics": {"accuracy": accuracy}}]
    if done:
        records.append({"kind": "done", "rank": 0, "ts": time.time(), "final_loss": 1.0, "steps": 60})
    relay(db, job=job, attempt=attempt, state=RelayState(), records=records, running=running)


def test_a_job_below_the_median_at_a_step_is_stopped_and_says_why(db: Session, tmp_path: Path) -> None:
    jobs = sweep_of(db, 5, min_jobs=3, after_steps=10)
    for job, accuracy in zip(jobs[:3], (0.9, 0.8, 0.7), strict=True):
        evaluated(db, job, 20, accuracy)
    evaluated(db, jobs[0], 40, 0.95)  # another step does not count at step 20
    evaluated(db, jobs[1], 20, 0.6)  # a job's latest evaluation at a step is the one that counts: 0.9, 0.6, 0.7

    better, worse = jobs[3], jobs[4]
    runner = running(db, better, tmp_path / "a")
    report_eval(db, better, runner, 20, 0.75)  # above their median (0.7): goes on
    assert not better.cancel_requested

    runner = running(db, worse, tmp_path / "b")
    report_eval(db, worse, runner, 10, 0.1)  # not judged before after_steps
    assert not worse.cancel_requested
    report_eval(db, worse, runner, 20, 0.65)  # 0.9, 0.6, 0.7 and 0.75: median 0.725
    assert worse.cancel_requested
    why = "stopped early: accuracy 0.65 at step 20, worse than the median of the 4 other jobs of sweep"
    assert worse.exit_reason is not None and worse.exit_reason.startswith(why), worse.exit_reason
    assert worse.exit_reason.endswith("there (0.725)"), worse.exit_reason
    runner._report(db, Outcome(ExitClass.CANCELLED, "cancel requested"), 75)  # the trainer stopped, checkpoint first
    assert worse.state == "CANCELLED"
    timeline = [
        (e.type, e.message) for e in db.scalars(select(Event).where(Event.job_id == worse.id).order_by(Event.id))
    ]
    assert [t for t, _ in timeline].count("STOPPED_EARLY") == 1
    assert timeline[-1][1].startswith(why), timeline


def test_too_few_to_compare_or_the_last_step_never_stops_a_job(db: Session, tmp_path: Path) -> None:
    jobs = sweep_of(db, 4, min_jobs=3)
    evaluated(db, jobs[0], 20, 0.9)
    evaluated(db, jobs[1], 20, 0.8)
    runner = running(db, jobs[3], tmp_path)
    report_eval(db, jobs[3], runner, 20, 0.1)  # two others only
    assert not jobs[3].cancel_requested
    for job in jobs[:3]:
        evaluated(db, job, 60, 0.9)
    report_eval(db, jobs[3], runner, 60, 0.1)  # its last step: it ends anyway
    assert not jobs[3].cancel_requested and jobs[3].exit_reason is None


def test_an_evaluation_relayed_once_the_trainer_finished_stops_nothing(db: Session, tmp_path: Path) -> None:
    """A short job's evaluations may all arrive with its end (one heartbeat): too late to stop it, so it is not
    said to have been stopped (the digits example on a CPU trains 200 steps within one heartbeat)."""
    jobs = sweep_of(db, 4, min_jobs=3)
    for job in jobs[:3]:
        evaluated(db, job, 20, 0.9)
    runner = running(db, jobs[3], tmp_path)
    report_eval(db, jobs[3], runner, 20, 0.1, done=True)
    report_eval(db, jobs[3], runner, 20, 0.1, running=False)
    assert not jobs[3].cancel_requested
    assert not db.scalars(select(Event).where(Event.job_id == jobs[3].id, Event.type == "STOPPED_EARLY")).all()
    report_eval(db, jobs[3], runner, 20, 0.1)
    assert jobs[3].cancel_requested


def test_successive_halving_keeps_the_best_third_at_each_rung_judging_a_job_once_there(
    db: Session, tmp_path: Path
) -> None:
    jobs = sweep_of(db, 7, rule="successive_halving", min_steps=10, reduction_factor=3, min_jobs=2)
    for job, accuracy in zip(jobs[:4], (0.9, 0.8, 0.7, 0.6), strict=True):
        evaluated(db, job, 10, accuracy)  # rung 10
    evaluated(db, jobs[0], 20, 0.1)  # a later evaluation in the same rung is not its value there

    runner = running(db, jobs[4], tmp_path / "a")
    report_eval(db, jobs[4], runner, 10, 0.85)  # 5 at the rung: the best 1 goes on (5 // 3); 0.9 beats it
    assert jobs[4].cancel_requested
    why = (
        "stopped early: accuracy 0.85 at step 10, not among the best 1 of the 5 jobs of sweep "
        f"{jobs[0].sweep_id} at rung 10 (successive halving by 3; the 1st best: 0.9)"
    )
    assert jobs[4].exit_reason == why

    runner = running(db, jobs[5], tmp_path / "b")
    report_eval(db, jobs[5], runner, 5, 0.1)  # before the first rung: not judged
    report_eval(db, jobs[5], runner, 10, 0.95)  # 6 there (with the stopped job's): the best 2 go on; it is 1st
    assert not jobs[5].cancel_requested
    report_eval(db, jobs[5], runner, 20, 0.01)  # judged once at a rung: its first evaluation there
    assert not jobs[5].cancel_requested
    evaluated(db, jobs[0], 30, 0.9)  # rung 30: two others
    evaluated(db, jobs[1], 30, 0.95)
    report_eval(db, jobs[5], runner, 30, 0.92)  # 3 // 3 = 1 goes on: 0.95
    assert jobs[5].cancel_requested and jobs[5].exit_reason is not None
    assert "at rung 30" in jobs[5].exit_reason and "the 1st best: 0.95" in jobs[5].exit_reason
    stopped = db.scalars(select(Event).where(Event.job_id == jobs[5].id, Event.type == "STOPPED_EARLY")).one()
    assert stopped.data == {
        "step": 30,
        "metric": "accuracy",
        "value": 0.92,
        "rule": "successive_halving",
        "rung": 30,
        "kept": 1,
        "compared": 2,
        "cutoff": 0.95,
    }
