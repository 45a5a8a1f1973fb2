"""The expected start: ``plan()`` run forward from built snapshots (``scheduler.simulate.projection``)."""

from __future__ import annotations

import math
from typing import Any

from core.policy_config import PolicyConfig
from scheduler.policy.snapshot import ANY, PendingJob, PlacedHost, RunningJob, Snapshot, TeamInfo
from scheduler.simulate.projection import Ends, Start, project
from scheduler.simulate.synthetic import gpu_cluster

NOW = 1_000_000.0
CONFIG = PolicyConfig(service_classes=False, preempt_only_at_risk=False, max_preemptions_per_job=None)
QOS = {"gold": (1000, False), "silver": (500, False)}


def pending(id: int, gpus: int, *, qos: str = "silver", age: float = 0.0, limit: float | None = None) -> PendingJob:
    prio, pre = QOS[qos]
    return PendingJob(
        id=id,
        team_id=1,
        qos=qos,
        qos_priority=prio,
        preemptible=pre,
        gpus=gpus,
        submitted_at=NOW - age,
        estimated_runtime_s=limit,
    )


def running(id: int, units: range, *, limit: float | None, **kw: Any) -> RunningJob:
    return RunningJob(
        id=id,
        team_id=1,
        qos="silver",
        qos_priority=500,
        preemptible=False,
        gpus=len(units),
        gpu_type="H100",
        quota_key=ANY,
        placement=(PlacedHost("h0000", tuple(f"GPU-h0000-{i}" for i in units)),),
        started_at=NOW,
        expected_end=NOW + limit if limit is not None else None,
        time_limit_s=limit,
        **kw,
    )


def snap(run: tuple[RunningJob, ...], wait: tuple[PendingJob, ...]) -> Snapshot:
    return Snapshot(now=NOW, hosts=gpu_cluster(1), running=run, pending=wait, teams=(TeamInfo(1, "a"),))


def start(s: Snapshot, job: int, ends: dict[int, float], runtime: dict[int, float] | None = None) -> Start:
    return project(s, CONFIG, job, Ends(ends, runtime or {}), horizon_s=30 * 86400, max_events=50)


def test_a_job_behind_two_running_jobs_starts_when_the_first_end_that_frees_enough_gpus_comes() -> None:
    two = (running(1, range(0, 4), limit=1000), running(2, range(4, 8), limit=3000))
    ends = {1: NOW + 1000, 2: NOW + 3000}
    four = start(snap(two, (pending(10, 4),)), 10, ends)
    assert four.at == NOW + 1000 and four.hosts == ("h0000",) and four.events == 1
    six = start(snap(two, (pending(10, 6),)), 10, ends)
    assert six.at == NOW + 3000 and six.events == 2  # job 1's four GPUs are not enough


def test_a_job_ahead_takes_the_first_gpus_freed_and_the_job_waits_for_the_next() -> None:
    two = (running(1, range(0, 4), limit=1000), running(2, range(4, 8), limit=3000))
    s = snap(two, (pending(9, 4, qos="gold", limit=5000), pending(10, 4, age=600)))
    assert start(s, 10, {1: NOW + 1000, 2: NOW + 3000}, {9: 5000}).at == NOW + 3000
    assert start(s, 9, {1: NOW + 1000, 2: NOW + 3000}).at == NOW + 1000


def test_backfill_a_short_job_starts_now_behind_a_reservation_a_long_one_waits_for_it() -> None:
    one = (running(1, range(0, 6), limit=3000),)
    head = pending(9, 8, age=600, limit=4000)  # needs the whole host: reserves it for job 1's limit
    short = start(snap(one, (head, pending(10, 2, limit=1000))), 10, {1: NOW + 3000}, {9: 4000})
    assert short.at == NOW and short.events == 0  # ends before the reservation: backfilled at once
    long = start(snap(one, (head, pending(10, 2, limit=9000))), 10, {1: NOW + 3000}, {9: 4000})
    assert long.at == NOW + 3000 + 4000  # would delay the head: waits until the head has run


def test_a_range_from_the_earliest_and_the_latest_ends() -> None:
    two = (running(1, range(0, 4), limit=7200), running(2, range(4, 8), limit=7200))
    s = snap(two, (pending(10, 6),))
    early = start(s, 10, {1: NOW + 1800, 2: NOW + 2400})  # as the jobs' progress says
    late = start(s, 10, {1: NOW + 7200, 2: NOW + 7200})  # at their limits
    assert (early.at, late.at) == (NOW + 2400, NOW + 7200)


def test_an_unbounded_running_job_makes_the_start_unknown_and_is_named() -> None:
    two = (running(1, range(0, 4), limit=1000), running(2, range(4, 8), limit=None))
    got = start(snap(two, (pending(10, 6),)), 10, {1: NOW + 1000, 2: math.inf})
    assert got.at is None and got.waits_on == (2,)


def test_the_projection_stops_at_its_bound_of_events() -> None:
    # eight one-GPU jobs ahead, each running 60 s after the other: the job is ninth in line
    host = tuple(running(i, range(i, i + 1), limit=60.0 * (i + 1)) for i in range(8))
    ahead = tuple(pending(20 + i, 8, qos="gold", limit=60) for i in range(8))
    s = snap(host, (*ahead, pending(99, 8, age=10)))
    ends = {i: NOW + 60.0 * (i + 1) for i in range(8)}
    got = project(s, CONFIG, 99, Ends(ends, dict.fromkeys(range(20, 28), 60.0)), horizon_s=86400, max_events=5)
    assert got.at is None and got.events == 5
    full = project(s, CONFIG, 99, Ends(ends, dict.fromkeys(range(20, 28), 60.0)), horizon_s=86400, max_events=50)
    assert full.at == NOW + 480 + 8 * 60


def test_a_job_not_in_the_snapshot_has_no_start() -> None:
    assert start(snap((), ()), 10, {}) == Start(None, stopped="absent")
