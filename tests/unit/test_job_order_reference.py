"""``JobOrder`` inlines ``urgency``, ``Estimator.remaining_s`` and ``service_class`` for the cycle's speed
(scheduler/policy/fairshare.py); these properties hold the inlined copies to the reference functions, so a change
to one that misses the other fails here."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy_config import PolicyConfig
from core.states import Reason
from scheduler.policy.estimate import Estimator, service_class
from scheduler.policy.fairshare import JobOrder, urgency
from scheduler.policy.snapshot import PendingJob, TeamInfo

NOW = 100_000.0
TEAMS = (1, 2, 3)

# Coarse grids, so that the boundaries (waited exactly the starvation age, due exactly at the risk line) come up.
grid = st.integers(0, 10).map(lambda k: k * 10_000.0)
times = st.one_of(st.none(), st.integers(1, 20).map(lambda k: k * 10_000.0), st.floats(1.0, 200_000.0))


@st.composite
def pending(draw: st.DrawFn, job_id: int) -> PendingJob:
    gpus = draw(st.sampled_from([0, 1, 2, 8, 64]))
    return PendingJob(
        id=job_id,
        team_id=draw(st.sampled_from(TEAMS)),
        qos="gold",
        qos_priority=1000,
        preemptible=False,
        gpus=gpus,
        cpu_slots=draw(st.integers(1, 8)),
        submitted_at=draw(grid),
        priority=draw(st.integers(0, 2)),
        max_queue_wait_s=draw(times),
        # Mostly none (a deadline sends the job to ``urgency`` itself, so the inlined arithmetic is skipped).
        deadline=draw(st.one_of(st.none(), st.none(), st.floats(min_value=NOW - 5000, max_value=NOW + 50_000))),
        estimated_runtime_s=draw(times),
        attained_s=draw(st.sampled_from([0.0, 30.0, 600.0, 7200.0, 90_000.0])),
        wait_started_at=draw(st.one_of(st.none(), grid)),
        pending_reason=draw(st.sampled_from([None, Reason.RESERVATION.value, Reason.QUOTA.value])),
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[PendingJob], list[TeamInfo], PolicyConfig]:
    n = draw(st.integers(0, 30))
    jobs = [draw(pending(i + 1)) for i in range(n)]
    teams = [
        TeamInfo(
            id=t,
            name=f"t{t}",
            finished_runtimes_s=tuple(sorted(draw(st.lists(st.floats(1.0, 100_000.0), max_size=6)))),
            limit_use_ratio=draw(st.one_of(st.none(), st.floats(0.01, 2.0))),
        )
        for t in TEAMS
    ]
    config = PolicyConfig(
        ordering="kiln",
        service_classes=True,
        sla_urgency=draw(st.sampled_from([True, True, False])),
        urgent_after_breach=draw(st.booleans()),
        keep_reservations=draw(st.booleans()),
        starvation_age_s=draw(st.one_of(st.none(), grid.filter(bool))),
        oldest_first_after_s=None,
        sla_reserve_fraction=draw(st.sampled_from([0.0, 0.25, 0.5, 0.75])),
        service_base_gpu_s=draw(st.floats(60.0, 10_000.0)),
        service_factor=draw(st.floats(1.5, 10.0)),
    )
    return jobs, teams, config


@settings(max_examples=300, deadline=None)
@given(cases())
def test_inlined_urgency_and_service_class_equal_the_reference_functions(
    case: tuple[list[PendingJob], list[TeamInfo], PolicyConfig],
) -> None:
    jobs, teams, config = case
    order = JobOrder(jobs, teams, NOW, config)
    in_team_order = sorted(sorted(jobs, key=lambda j: (j.submitted_at, j.id)), key=lambda j: j.priority, reverse=True)
    at_risk, by_service = order._split(in_team_order)

    expected_urgent = []
    for j in in_team_order:
        u = urgency(j, NOW, config)
        if config.keep_reservations and j.pending_reason == Reason.RESERVATION.value:
            u = float("-inf")
        if u is not None:
            expected_urgent.append((u, j.submitted_at, j.id))
    assert [j.id for j in at_risk] == [t[2] for t in sorted(expected_urgent)]

    estimator = Estimator(teams)
    expected_class = {
        j.id: service_class(
            (j.gpus or j.cpu_slots) * estimator.remaining_s(j.team_id, j.estimated_runtime_s, j.attained_s),
            config.service_base_gpu_s,
            config.service_factor,
        )
        for j in in_team_order
    }
    seen = []
    for sc, per_team in by_service.items():
        for team_id, queue in per_team.items():
            assert all(j.team_id == team_id and expected_class[j.id] == sc for j in queue)
            positions = [in_team_order.index(j) for j in queue]
            assert positions == sorted(positions)  # each team's queue keeps the team's own order
            seen += [j.id for j in queue]
    assert sorted(seen + [j.id for j in at_risk]) == sorted(j.id for j in jobs)
