"""Table-driven cases for ``scheduler.policy.preemption`` (Kueue keeps its preemption cases beside the code): who
may be stopped for whom, why each victim is told it was, and what one cycle's ``Preemptor`` takes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import pytest

from core.policy_config import PolicyConfig
from core.states import JobState
from scheduler.policy.placement import ClusterState, Request
from scheduler.policy.preemption import Preemptor, eligible, victim_reason
from scheduler.policy.quota import QuotaLedger
from scheduler.policy.snapshot import ANY, PendingJob, PlacedHost, RunningJob, Snapshot, TeamInfo
from scheduler.simulate.synthetic import gpu_cluster

NOW = 1_000_000.0
PRIORITY = {"gold": 1000, "silver": 500, "bronze": 200, "best-effort": 0}


def running(id: int = 1, *, qos: str = "bronze", team: int = 2, preemptible: bool = True, **kw: Any) -> RunningJob:
    units = kw.pop("units", (0, 1, 2, 3))
    return RunningJob(
        id=id,
        team_id=team,
        qos=qos,
        qos_priority=PRIORITY[qos],
        preemptible=preemptible,
        gpus=len(units),
        gpu_type="H100",
        quota_key=kw.pop("quota_key", ANY),
        placement=(PlacedHost("h0000", tuple(f"GPU-h0000-{i}" for i in units)),),
        started_at=kw.pop("started_at", NOW - 3600.0),
        **kw,
    )


def pending(id: int = 9, *, qos: str = "gold", team: int = 1, gpus: int = 8) -> PendingJob:
    return PendingJob(
        id=id, team_id=team, qos=qos, qos_priority=PRIORITY[qos], preemptible=False, gpus=gpus, submitted_at=NOW
    )


class Case(NamedTuple):
    name: str
    victim: RunningJob
    requester: PendingJob
    reclaims: bool  # the requester's team reclaims lent quota from the victim's
    own_lower_classes: bool
    eligible: bool


CASES = [
    Case("a preemptible lower class", running(), pending(), False, False, True),
    Case("an equal class, not reclaiming", running(qos="gold"), pending(), False, False, False),
    Case("a higher class", running(qos="gold"), pending(qos="silver"), False, False, False),
    Case("not preemptible, another team", running(preemptible=False), pending(), False, False, False),
    Case("not preemptible, own team, rule off", running(team=1, preemptible=False), pending(), False, False, False),
    Case("not preemptible, own team, rule on", running(team=1, preemptible=False), pending(), False, True, True),
    Case("an equal class, lent quota reclaimed", running(qos="gold"), pending(), True, False, True),
    Case("a higher class, lent quota", running(qos="gold"), pending(qos="silver"), True, False, False),
    Case("own team: nothing to reclaim", running(qos="gold", team=1), pending(), True, False, False),
    Case("already asked to stop", running(preempt_requested=True), pending(), False, False, False),
    Case("not running", running(state=JobState.PREEMPTING.value), pending(), False, False, False),
    Case("under its minimum run time", running(started_at=NOW - 60.0), pending(), False, False, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_who_may_be_stopped_for_whom(case: Case) -> None:
    assert (
        eligible(
            case.victim,
            requester_priority=case.requester.qos_priority,
            requester_team=case.requester.team_id,
            quota_key=ANY,
            reclaim_from=lambda _v: case.reclaims,
            now=NOW,
            min_run_time_s=600.0,
            own_lower_classes=case.own_lower_classes,
        )
        is case.eligible
    )


REASONS = [
    ("a lower class", running(), pending(), "preempted for job 9 (gold outranks bronze)"),
    (
        "its own team's lower class",
        running(team=1, preemptible=False),
        pending(),
        "preempted for job 9 of its own team (gold outranks bronze)",
    ),
    ("lent quota", running(qos="gold"), pending(), "lent quota reclaimed by team 1 for job 9"),
    (
        "not preemptible, another team",
        running(preemptible=False),
        pending(),
        "lent quota reclaimed by team 1 for job 9",
    ),
]


@pytest.mark.parametrize(("victim", "requester", "why"), [r[1:] for r in REASONS], ids=[r[0] for r in REASONS])
def test_each_victim_is_told_why(victim: RunningJob, requester: PendingJob, why: str) -> None:
    assert victim_reason(victim, requester) == why


def _preemptor(*jobs: RunningJob, config: PolicyConfig | None = None) -> Preemptor:
    teams = (TeamInfo(1, "a"), TeamInfo(2, "b"))
    snapshot = Snapshot(now=NOW, hosts=gpu_cluster(1), running=jobs, pending=(), teams=teams)
    state = ClusterState(snapshot.hosts, snapshot.running)
    ledger = QuotaLedger(snapshot.teams, snapshot.running, enabled=False)
    return Preemptor(snapshot, config or PolicyConfig(), state, ledger)


def _request(gpus: int) -> Request:
    return Request(models=("H100",), units=gpus)


def test_a_preemptor_takes_the_victims_once_and_says_how_many_it_waits_for() -> None:
    first, second = running(1, units=(0, 1, 2, 3)), running(2, units=(4, 5, 6, 7))
    preemptor = _preemptor(first, second)
    targets = preemptor.targets(pending(gpus=4), _request(4), reservations=0, should_preempt=lambda: True)
    assert targets is not None and targets.stopping == 1 and len(targets.units) == 4
    (taken,) = targets.preemptions
    assert taken.preemptor_id == 9 and taken.reason == "preempted for job 9 (gold outranks bronze)"
    # The next requester of the cycle may take only what is left; after that, nothing.
    again = preemptor.targets(pending(10, gpus=4), _request(4), reservations=0, should_preempt=lambda: True)
    assert again is not None and {p.job_id for p in again.preemptions} == {1, 2} - {taken.job_id}
    assert preemptor.targets(pending(11, gpus=4), _request(4), reservations=0, should_preempt=lambda: True) is None


def test_a_preemptor_asks_whether_to_preempt_only_with_victims_to_take() -> None:
    asked: list[int] = []

    def should(job_id: int) -> bool:
        asked.append(job_id)
        return False

    preemptor = _preemptor(running(qos="gold"))  # no one a gold job may stop
    assert preemptor.targets(pending(gpus=8), _request(8), reservations=0, should_preempt=lambda: should(9)) is None
    assert asked == []
    preemptor = _preemptor(running())
    assert preemptor.targets(pending(gpus=8), _request(8), reservations=0, should_preempt=lambda: should(9)) is None
    assert asked == [9]


def test_a_job_stopping_already_counts_before_any_new_victim() -> None:
    stopping = replace(running(1), preempt_requested=True, state=JobState.PREEMPTING.value)
    preemptor = _preemptor(stopping, running(2, units=(4, 5, 6, 7)))
    targets = preemptor.targets(pending(gpus=4), _request(4), reservations=0, should_preempt=lambda: True)
    assert targets is not None and targets.preemptions == () and targets.stopping == 1
