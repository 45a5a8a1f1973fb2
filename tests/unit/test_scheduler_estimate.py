"""kiln's estimates of remaining service, the service classes they order a QoS class by, and what they may read."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy_config import PolicyConfig
from core.states import Reason
from scheduler.policy.estimate import DEFAULT_UNKNOWN_S, Estimator, service_class
from scheduler.policy.fairshare import JobOrder
from scheduler.policy.plan import plan
from scheduler.policy.snapshot import ANY, PendingJob, PlacedHost, QuotaInfo, RunningJob, Snapshot, TeamInfo
from scheduler.simulate.synthetic import gpu_cluster

NOW = 1_000_000.0
H = 3600.0


def pj(
    id: int,
    gpus: int = 4,
    *,
    limit: float | None = None,
    attained: float = 0.0,
    age: float = 0.0,
    qos: str = "silver",
    prio: int = 500,
    team: int = 1,
    **kw: object,
) -> PendingJob:
    return PendingJob(
        id=id,
        team_id=team,
        qos=qos,
        qos_priority=prio,
        preemptible=False,
        gpus=gpus,
        submitted_at=NOW - age,
        estimated_runtime_s=limit,
        attained_s=attained,
        **kw,
    )  # type: ignore[arg-type]


def team(history: tuple[float, ...] = (), ratio: float | None = None) -> TeamInfo:
    return TeamInfo(1, "a", finished_runtimes_s=tuple(sorted(history)), limit_use_ratio=ratio)


def test_a_time_limit_is_scaled_by_how_much_of_their_limits_the_team_uses() -> None:
    est = Estimator([team(ratio=0.25)])
    assert est.remaining_s(1, 8 * H, 0.0) == 2 * H
    assert est.remaining_s(1, 8 * H, 4 * H) == 1 * H  # a quarter of what is left of the limit
    assert est.remaining_s(1, 8 * H, 6 * H) == 0.5 * H  # never below a minute:
    assert est.remaining_s(1, 8 * H, 8 * H) == 60.0


def test_without_a_limit_the_mean_residual_life_of_the_teams_history() -> None:
    est = Estimator([team(history=(1 * H, 2 * H, 9 * H))])
    assert est.remaining_s(1, None, 0.0) == 4 * H  # the mean run time
    assert est.remaining_s(1, None, 1.5 * H) == 4 * H  # (2 + 9) / 2 - 1.5: it outlived the shortest
    assert est.remaining_s(1, None, 10 * H) == 10 * H  # past all of history: as long again
    assert Estimator([team()]).remaining_s(1, None, 0.0) == DEFAULT_UNKNOWN_S  # no history yet


@given(st.lists(st.floats(60, 1e6), min_size=1, max_size=40), st.floats(0, 2e6), st.floats(0, 2e6))
def test_the_longer_a_job_has_run_the_longer_it_is_expected_to_need_in_total(
    history: list[float], a: float, b: float
) -> None:
    est = Estimator([team(history=tuple(history))])
    lo, hi = sorted((a, b))
    assert est.remaining_s(1, None, lo) + lo <= est.remaining_s(1, None, hi) + hi + 1e-6


def test_service_classes_are_discretised_geometrically() -> None:
    assert service_class(3 * H, 4 * H, 4.0) == 0
    assert service_class(5 * H, 4 * H, 4.0) == service_class(15 * H, 4 * H, 4.0) == 1
    assert service_class(17 * H, 4 * H, 4.0) == 2


def test_within_a_qos_class_less_expected_service_goes_first_whatever_the_age() -> None:
    jobs = (pj(1, 8, limit=48 * H, age=5000), pj(2, 4, limit=2 * H, age=10), pj(3, 4, age=100))
    order = [j.id for j in JobOrder(jobs, (team(ratio=0.5),), NOW, PolicyConfig())]
    assert order == [2, 3, 1]  # 4 GPU-h, 16 GPU-h (no limit, no history: 4 h), 192 GPU-h
    off = [j.id for j in JobOrder(jobs, (team(ratio=0.5),), NOW, PolicyConfig(service_classes=False))]
    assert off == [1, 3, 2]  # age only


def test_class_order_service_lets_a_short_lower_class_job_past_a_long_higher_class_one() -> None:
    def preemptible(job: PendingJob) -> PendingJob:
        return dataclasses.replace(job, preemptible=True)

    long_silver = pj(1, 8, limit=48 * H, age=100)
    long_bronze = preemptible(pj(2, 8, limit=48 * H, age=50, qos="bronze", prio=200))
    short_be = preemptible(pj(3, 4, limit=2 * H, age=20, qos="best-effort", prio=0))
    at_risk_be = preemptible(pj(4, 4, limit=100 * H, age=2 * 86400, qos="best-effort", prio=0))  # aged 1 day+
    jobs = (long_silver, long_bronze, short_be, at_risk_be)
    teams = (team(ratio=0.5),)

    def order(class_order: str) -> list[int]:
        config = PolicyConfig(class_order=class_order, starvation_age_s=86400.0)  # type: ignore[arg-type]
        return [j.id for j in JobOrder(jobs, teams, NOW, config)]

    assert order("strict") == [1, 2, 4, 3]  # class by class
    assert order("service") == [4, 3, 1, 2]  # at risk first, then 4 GPU-h, then the 192 GPU-h ones
    assert order("guaranteed") == [1, 4, 3, 2]  # silver (not preemptible) first, then by service


def test_sla_risk_still_goes_ahead_of_service_classes() -> None:
    urgent = pj(1, 32, limit=100 * H, age=1000, max_queue_wait_s=1800.0)
    order = [j.id for j in JobOrder((pj(2, 4, limit=H), urgent), (team(),), NOW, PolicyConfig())]
    assert order == [1, 2]


def test_the_oldest_long_waiting_job_of_a_class_goes_first_but_only_one() -> None:
    # Past its SLA (triage: not urgent), a large job would wait behind every smaller one for ever; once it is
    # the oldest of its class and has waited oldest_first_after_s it goes first (one job per class at a time).
    big = pj(1, 32, limit=100 * H, age=4 * 86400, max_queue_wait_s=1800.0)
    big2 = pj(4, 32, limit=100 * H, age=3 * 86400, max_queue_wait_s=1800.0)
    small = (pj(2, 4, limit=H, age=600), pj(3, 4, limit=H, age=60))
    jobs = (*small, big, big2)
    aging = PolicyConfig(oldest_first_after_s=2 * 86400)
    order = JobOrder(jobs, (team(),), NOW, aging)
    assert [j.id for j in order] == [1, 2, 3, 4] and order.aged == {1}
    assert [j.id for j in JobOrder(jobs, (team(),), NOW, PolicyConfig())] == [2, 3, 1, 4]  # off by default
    young = PolicyConfig(oldest_first_after_s=5 * 86400)
    assert [j.id for j in JobOrder(jobs, (team(),), NOW, young)] == [2, 3, 1, 4]  # not waited long enough


def test_a_job_first_only_by_age_reserves_but_never_preempts() -> None:
    # One host, busy with a preemptible bronze job; a gold job past its SLA, first only by age, does not preempt it.
    busy = RunningJob(
        id=9,
        team_id=1,
        qos="bronze",
        qos_priority=200,
        preemptible=True,
        gpus=8,
        gpu_type="H100",
        quota_key=ANY,
        placement=(PlacedHost("h0000", tuple(f"GPU-h0000-{i}" for i in range(8))),),
        started_at=NOW - H,
        expected_end=NOW + 10 * H,
    )
    gold = pj(1, 8, limit=H, age=3 * 86400, qos="gold", prio=1000, max_queue_wait_s=1800.0)
    s = Snapshot(now=NOW, hosts=gpu_cluster(1), running=(busy,), pending=(gold,), teams=(team(),))
    d = plan(s, PolicyConfig(oldest_first_after_s=86400.0))
    assert d.preemptions == () and [r.job_id for r in d.reservations] == [1]
    at_risk = dataclasses.replace(gold, submitted_at=NOW - 1200)  # 10 of its 30 minutes left: at risk, preempts
    assert [p.job_id for p in plan(dataclasses.replace(s, pending=(at_risk,))).preemptions] == [9]


def test_a_requeued_job_has_only_the_rest_of_its_queue_wait_budget() -> None:
    # Waited 20 of its 30 minutes before a preemption; requeued 6 minutes ago: 4 minutes left, so at risk.
    job = pj(1, 4, age=7200, max_queue_wait_s=600.0, wait_started_at=NOW - 360)
    assert job.queue_wait_due == NOW + 240
    assert [j.id for j in JobOrder((pj(2, 1, limit=60.0), job), (team(),), NOW, PolicyConfig())] == [1, 2]


def test_running_jobs_without_a_limit_end_when_kiln_expects_not_never() -> None:
    # One host, fully busy with a job without a time limit that has run 1 h; the team's jobs ran 3 h.
    busy = RunningJob(
        id=9,
        team_id=1,
        qos="silver",
        qos_priority=500,
        preemptible=False,
        gpus=8,
        gpu_type="H100",
        quota_key=ANY,
        placement=(PlacedHost("h0000", tuple(f"GPU-h0000-{i}" for i in range(8))),),
        started_at=NOW - H,
    )
    s = Snapshot(
        now=NOW, hosts=gpu_cluster(1), running=(busy,), pending=(pj(1, 8),), teams=(team(history=(3 * H, 3 * H)),)
    )
    reservation = plan(s).reservations[0]
    assert reservation.start == NOW + 2 * H
    assert plan(s, PolicyConfig(service_classes=False)).reservations[0].start is None  # unknown without it


# -- what the policy may see --------------------------------------------------------------------------------------

TRUTH = {"runtime", "work", "remaining_work", "true_runtime", "duration", "runtime_s"}


def test_no_job_view_has_a_run_time_field() -> None:
    from scheduler.simulate.jobs import SimJob, Submission

    for cls in (PendingJob, RunningJob, Submission, SimJob, TeamInfo):
        names = {f.name for f in dataclasses.fields(cls)}
        assert not names & TRUTH, (cls.__name__, names & TRUTH)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([4, 8, 16]), st.floats(0, 20 * H), st.floats(600, 30 * H), st.floats(0.05, 20.0)),
        min_size=3,
        max_size=25,
    )
)
def test_the_replay_shows_plan_nothing_of_the_true_run_times(jobs: list[tuple[int, float, float, float]]) -> None:
    """Two traces that differ only in their true run times (the users' limits the same) hand plan() the very same
    snapshots until the first job ends: what a job will really take reaches the policy through nothing else."""
    from scheduler.simulate.simulation import Simulation
    from scheduler.simulate.trace import TraceJob

    def snapshots(scale_of: list[float]) -> tuple[list[Snapshot], float]:
        trace = [TraceJob(f"j{i}", g, t, w * k) for i, ((g, t, w, _), k) in enumerate(zip(jobs, scale_of, strict=True))]
        sim = Simulation(sorted(trace, key=lambda j: j.submit), gpu_cluster(4), PolicyConfig())
        for i, (g, _t, w, _) in enumerate(sorted(jobs, key=lambda j: j[1]), 1):  # the same limits in both
            sim.jobs[i].sub = dataclasses.replace(sim.jobs[i].sub, time_limit_s=None if g == 16 else 10 * w)
        seen: list[Snapshot] = []
        original = sim.snapshot

        def recording(now: float) -> Snapshot:
            snap = original(now)
            seen.append(snap)
            return snap

        sim.snapshot = recording  # type: ignore[method-assign]
        sim.run("kiln")
        first_end = min((j.finish for j in sim.jobs.values() if j.finish is not None), default=float("inf"))
        return seen, first_end

    a, end_a = snapshots([1.0] * len(jobs))
    b, end_b = snapshots([k for *_, k in jobs])
    horizon = min(end_a, end_b)
    before_a = [s for s in a if s.now < horizon]
    before_b = [s for s in b if s.now < horizon]
    assert before_a == before_b


def bronze(id: int, gpus: int = 8, **kw: object) -> PendingJob:
    return dataclasses.replace(pj(id, gpus, qos="bronze", prio=200, **kw), preemptible=True)  # type: ignore[arg-type]


def long_behind_short(waited_days: float) -> tuple[PendingJob, ...]:
    """Two short bronze jobs (2, 3), a long 8-GPU bronze job (1: limit 40 days, 20 expected at a team's use of half
    its limits) that has waited ``waited_days``, and a small gold job (4)."""
    short = (bronze(2, limit=2 * H, age=600), bronze(3, limit=2 * H, age=60))
    return (*short, bronze(1, limit=40 * 86400, age=waited_days * 86400), pj(4, 4, limit=H, qos="gold", prio=1000))


def busy_best_effort() -> RunningJob:
    """A best-effort job on all 8 GPUs of host h0000, 10 more hours to go by its limit."""
    return RunningJob(
        id=9,
        team_id=1,
        qos="best-effort",
        qos_priority=0,
        preemptible=True,
        gpus=8,
        gpu_type="H100",
        quota_key=ANY,
        placement=(PlacedHost("h0000", tuple(f"GPU-h0000-{i}" for i in range(8))),),
        started_at=NOW - H,
        expected_end=NOW + 10 * H,
        time_limit_s=11 * H,
    )


def test_the_makespan_guard_puts_a_long_waiting_long_job_first_in_the_preemptible_tier() -> None:
    # The long job has waited 12 days; the short jobs' expected work drains the 8-GPU cluster in well under its 20:
    # it would set the makespan if left last.
    jobs = long_behind_short(12)
    short, long, gold = jobs[:2], jobs[2], jobs[3]
    teams = (team(ratio=0.5),)
    off = PolicyConfig(starvation_age_s=None)  # no aging: only the guard moves the long job
    guard = off.model_copy(update={"makespan_guard": 0.4, "makespan_guard_wait": 0.5})
    order = JobOrder(jobs, teams, NOW, guard, capacity=8)
    assert [j.id for j in order] == [4, 1, 2, 3]  # after the non-preemptible tier, ahead of the short jobs
    assert order.aged == {1} and 1 in order.urgent  # it may reserve, never preempt
    assert [j.id for j in JobOrder(jobs, teams, NOW, off, capacity=8)] == [4, 2, 3, 1]  # off by default
    # Not kept waiting half its expected run time yet (9 of 20 days): its place by service class.
    young = dataclasses.replace(long, submitted_at=NOW - 9 * 86400)
    assert [j.id for j in JobOrder((*short, young, gold), teams, NOW, guard, capacity=8)] == [4, 2, 3, 1]
    # The running work is expected to take longer than the long job: nothing to guard.
    busy = JobOrder(jobs, teams, NOW, guard, capacity=8, running_gpu_s=8 * 60 * 86400)
    assert [j.id for j in busy] == [4, 2, 3, 1]


def test_the_backlog_bound_puts_a_job_waiting_longer_than_the_backlog_first_in_the_preemptible_tier() -> None:
    # 8 GPUs. The long job has waited 30 days: longer than the ~20 the cluster needs to drain everything it knows
    # of, itself included. FIFO would have started it long ago; the service order keeps passing it over.
    jobs = long_behind_short(30)
    short, old, gold = jobs[:2], jobs[2], jobs[3]
    teams = (team(ratio=0.5),)
    bound = PolicyConfig()
    order = JobOrder(jobs, teams, NOW, bound, capacity=8)
    assert [j.id for j in order] == [4, 1, 2, 3]  # after the non-preemptible tier, ahead of the short jobs
    assert order.aged == {1} and 1 in order.urgent  # it may reserve, never preempt
    off = bound.model_copy(update={"backlog_bound": None})
    assert [j.id for j in JobOrder(jobs, teams, NOW, off, capacity=8)] == [4, 2, 3, 1]
    # Waited 15 days of the ~20 the backlog needs: FIFO would not have started it either.
    young = dataclasses.replace(old, submitted_at=NOW - 15 * 86400)
    assert [j.id for j in JobOrder((*short, young, gold), teams, NOW, bound, capacity=8)] == [4, 2, 3, 1]
    # Queued 6 of its 30 days (it ran 24 before a preemption, 8 are expected to be left): the bound counts the time
    # queued, not the time since submission.
    ran = dataclasses.replace(old, attained_s=24 * 86400)
    assert [j.id for j in JobOrder((*short, ran, gold), teams, NOW, bound, capacity=8)] == [4, 2, 3, 1]
    # The running work adds to the backlog: 30 days is no longer overdue.
    busy = JobOrder(jobs, teams, NOW, bound, capacity=8, running_gpu_s=8 * 20 * 86400)
    assert [j.id for j in busy] == [4, 2, 3, 1]


def test_a_job_whose_limit_ends_within_the_backlog_is_overdue_only_at_the_short_bound() -> None:
    # A 2-hour job cannot outlast a 20-day backlog, so it cannot set the makespan: after 31 days (1.5 drain times)
    # it keeps its place by service class (oldest of its class); after 41 (2) it is overdue, behind the long job.
    jobs = long_behind_short(30)
    teams = (team(ratio=0.5),)
    config = PolicyConfig()
    waited_31 = bronze(5, limit=2 * H, age=31 * 86400)
    assert [j.id for j in JobOrder((*jobs, waited_31), teams, NOW, config, capacity=8)] == [4, 1, 5, 2, 3]
    waited_41 = bronze(5, limit=2 * H, age=41 * 86400)
    order = JobOrder((*jobs, waited_41), teams, NOW, config, capacity=8)
    assert [j.id for j in order] == [4, 1, 5, 2, 3] and order.aged == {1, 5}
    never = config.model_copy(update={"backlog_bound_short": None})
    order = JobOrder((*jobs, waited_41), teams, NOW, never, capacity=8)
    assert [j.id for j in order] == [4, 1, 5, 2, 3] and order.aged == {1}


def test_the_backlog_bounds_lane_takes_the_most_time_limit_left_first() -> None:
    # Longest processing time first on the only upper bound kiln has: a job without a limit may run longest, then
    # the longest limit left (what it already ran counted off), however long each has waited.
    jobs = long_behind_short(30)  # 1: 40-day limit, waited 30 days
    teams = (team(ratio=0.5),)
    unlimited = bronze(5, age=60 * 86400)  # no limit: expected as the team's history says (none yet: a default)
    longer = bronze(6, limit=60 * 86400, attained=10 * 86400, age=70 * 86400)  # 50 days left
    config = PolicyConfig()
    # 16 GPUs: the work known (20 + 25 days of 8 GPUs, and hours) drains in about 23 days; all three are overdue.
    order = JobOrder((*jobs, unlimited, longer), teams, NOW, config, capacity=16)
    assert [j.id for j in order][:4] == [4, 5, 6, 1] and order.aged == {1, 5, 6}
    # At most ``backlog_bound_jobs`` a cycle, the first by that order.
    one = config.model_copy(update={"backlog_bound_jobs": 1})
    first = JobOrder((*jobs, unlimited, longer), teams, NOW, one, capacity=16)
    assert [j.id for j in first][:2] == [4, 5] and first.aged == {5}


def test_a_job_overdue_by_the_backlog_bound_reserves_but_never_preempts() -> None:
    busy = busy_best_effort()
    # Requeued after a preemption, with 6 minutes of its queue-wait budget left: at risk, it would preempt the
    # best-effort job; overdue, it reserves instead.
    old = bronze(1, limit=4 * 86400, age=30 * 86400, max_queue_wait_s=0.5 * H, wait_started_at=NOW - 0.4 * H)
    s = Snapshot(now=NOW, hosts=gpu_cluster(1), running=(busy,), pending=(old,), teams=(team(ratio=0.5),))
    d = plan(s, PolicyConfig())
    assert d.preemptions == () and [r.job_id for r in d.reservations] == [1]
    off = plan(s, PolicyConfig(backlog_bound=None))
    assert [p.job_id for p in off.preemptions] == [9]


def test_a_job_of_the_makespan_guard_reserves_but_never_preempts() -> None:
    busy = busy_best_effort()
    long = bronze(1, limit=40 * 86400, age=30 * 86400, max_queue_wait_s=8 * H)  # its SLA long broken
    s = Snapshot(now=NOW, hosts=gpu_cluster(1), running=(busy,), pending=(long,), teams=(team(ratio=0.5),))
    d = plan(s, PolicyConfig(class_order="guaranteed", makespan_guard=0.4, makespan_guard_wait=0.5))
    assert d.preemptions == () and [r.job_id for r in d.reservations] == [1]


def test_a_job_first_by_age_reserves_what_its_team_lent_instead_of_waiting_on_the_pool() -> None:
    # Two hosts, one cohort, 8 GPUs of nominal each, all lendable. Team 2 borrows everything: 8 GPUs on h0000, 2
    # and 6 on h0001. Team 1, within its nominal, waits on the pool: its old 8-GPU job (first by age) and a young
    # 2-GPU one. When team 2's 2-GPU job ends, the young job would take the 2 GPUs and the old one would never
    # have 8 at once; the old one reserves them instead.
    def running(id: int, gpus: int, host: str, first: int, ends_in: float) -> RunningJob:
        return RunningJob(
            id=id,
            team_id=2,
            qos="silver",
            qos_priority=500,
            preemptible=False,
            gpus=gpus,
            gpu_type="H100",
            quota_key=ANY,
            placement=(PlacedHost(host, tuple(f"GPU-{host}-{i}" for i in range(first, first + gpus))),),
            started_at=NOW - H,
            expected_end=NOW + ends_in,
            time_limit_s=H + ends_in,
        )

    quota = (QuotaInfo(key=ANY, nominal=8),)
    teams = (TeamInfo(1, "a", cohort="c", quotas=quota), TeamInfo(2, "b", cohort="c", quotas=quota))
    old = bronze(1, limit=2 * 86400, age=3 * 86400, max_queue_wait_s=8 * H)
    young = bronze(2, 2, limit=30 * 86400, age=60, max_queue_wait_s=8 * H)
    busy = (running(9, 8, "h0000", 0, 20 * H), running(11, 6, "h0001", 2, 2 * H))
    s = Snapshot(now=NOW, hosts=gpu_cluster(2), running=busy, pending=(old, young), teams=teams)
    aging = PolicyConfig(oldest_first_after_s=86400.0)
    d = plan(s, aging)
    assert d.admissions == () and [r.job_id for r in d.reservations] == [1]
    assert {w.job_id: w.reason for w in d.pending} == {1: Reason.RESERVATION, 2: Reason.PRIORITY}  # held for 1
    # not first by age (nor overdue by the backlog bound): it waits on the pool, and the young job takes the GPUs
    without = plan(s, PolicyConfig(backlog_bound=None))
    assert [a.job_id for a in without.admissions] == [2] and without.reservations == ()
