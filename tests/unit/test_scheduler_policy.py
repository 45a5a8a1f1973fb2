"""Focused tests of ``plan()``: each pending reason, and each feature of the policy."""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any

import pytest

from core.policy_config import PolicyConfig
from core.states import Reason
from scheduler.policy.decisions import Decisions
from scheduler.policy.plan import plan as policy_plan
from scheduler.policy.snapshot import (
    ANY,
    CPU,
    HostInfo,
    PendingJob,
    PlacedHost,
    QuotaInfo,
    RunningJob,
    Snapshot,
    TeamInfo,
    quota_key_for,
)
from scheduler.simulate.synthetic import GIB, cpu_host, gpu_cluster, gpu_host

NOW = 1_000_000.0
QOS = {"gold": (1000, False), "silver": (500, False), "bronze": (200, True), "best-effort": (0, True)}

# These tests pin the policy's mechanisms (reasons, reservations, backfill, victims, quotas) on hand-built
# snapshots; they run without kiln's service classes and estimated ends, which would reorder their jobs and
# project their running jobs' ends, and without the preemption budget, which would keep jobs that are not at
# risk from preempting (those are tested in tests/unit/test_scheduler_estimate.py).
MECHANISMS = PolicyConfig(service_classes=False, preempt_only_at_risk=False, max_preemptions_per_job=None)


def plan(s: Snapshot, config: PolicyConfig | None = None) -> Decisions:
    mechanisms = {"service_classes": False, "preempt_only_at_risk": False, "max_preemptions_per_job": None}
    return policy_plan(s, (config or MECHANISMS).model_copy(update=mechanisms))


def pj(id: int, gpus: int = 1, *, team: int = 1, qos: str = "silver", age: float = 0.0, **kw: Any) -> PendingJob:
    prio, pre = QOS[qos]
    return PendingJob(
        id=id, team_id=team, qos=qos, qos_priority=prio, preemptible=pre, gpus=gpus, submitted_at=NOW - age, **kw
    )


def rj(
    id: int,
    host: str,
    units: list[int],
    *,
    team: int = 1,
    qos: str = "bronze",
    ran: float = 3600.0,
    model: str = "H100",
    **kw: Any,
) -> RunningJob:
    prio, pre = QOS[qos]
    return RunningJob(
        id=id,
        team_id=team,
        qos=qos,
        qos_priority=prio,
        preemptible=pre,
        gpus=len(units),
        gpu_type=model,
        quota_key=kw.pop("quota_key", ANY),
        placement=(PlacedHost(host, tuple(f"GPU-{host}-{i}" for i in units)),),
        started_at=NOW - ran,
        **kw,
    )


def snap(
    *,
    hosts: int = 1,
    pending: tuple[PendingJob, ...] = (),
    running: tuple[RunningJob, ...] = (),
    teams: tuple[TeamInfo, ...] = (TeamInfo(1, "a"), TeamInfo(2, "b")),
    host_list: tuple[HostInfo, ...] = (),
) -> Snapshot:
    return Snapshot(now=NOW, hosts=host_list or gpu_cluster(hosts), pending=pending, running=running, teams=teams)


def reasons(s: Snapshot, config: PolicyConfig | None = None) -> dict[int, Reason]:
    return {p.job_id: p.reason for p in plan(s, config).pending}


def admitted(s: Snapshot, config: PolicyConfig | None = None) -> list[int]:
    return [a.job_id for a in plan(s, config).admissions]


def test_plan_pauses_the_garbage_collector_for_the_cycle_and_leaves_it_as_it_found_it() -> None:
    seen: list[bool] = []
    original = Snapshot.__getattribute__

    class Watched(Snapshot):  # records whether the collector runs while plan() reads the snapshot
        def __getattribute__(self, name: str) -> Any:
            seen.append(gc.isenabled())
            return original(self, name)

    s = snap(pending=(pj(1, 2),))
    watched = Watched(now=s.now, hosts=s.hosts, pending=s.pending, running=s.running, teams=s.teams)
    assert gc.isenabled()
    assert [a.job_id for a in policy_plan(watched).admissions] == [1]
    assert seen and not any(seen)
    assert gc.isenabled()
    gc.disable()  # a caller that turned it off keeps it off
    try:
        policy_plan(s)
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- pending reasons -----------------------------------------------------------------------------------------------


def test_reason_unschedulable_when_the_cluster_is_too_small() -> None:
    d = plan(snap(pending=(pj(1, 16),)))
    assert d.pending[0].reason == Reason.UNSCHEDULABLE and "the whole cluster has 8" in d.pending[0].message


def test_reason_unschedulable_for_shapes_the_total_alone_hid() -> None:
    """16 GPUs, 8 a host, on one 8-GPU host per type: the cluster has 16 GPUs but no two hosts of one type; they
    waited as Resources for ever (the check compared the total only)."""
    hosts = (gpu_host("a", 8, model="H100"), gpu_host("b", 8, model="H200"))
    d = plan(snap(host_list=hosts, pending=(pj(1, 16), pj(2, 16, gpus_per_node=8, gpu_type="H100"))))
    assert {p.job_id: p.reason for p in d.pending} == {1: Reason.UNSCHEDULABLE, 2: Reason.UNSCHEDULABLE}
    assert "the whole cluster has 8 of one type" in d.pending[0].message
    assert "the whole cluster has 1 host with 8 (" in d.pending[1].message, d.pending[1].message


def test_reason_quota() -> None:
    team = TeamInfo(1, "a", quotas=(QuotaInfo(ANY, 4),))
    s = snap(pending=(pj(1, 4), pj(2, 2)), teams=(team,))
    assert admitted(s) == [1]
    assert reasons(s) == {2: Reason.QUOTA}


def test_a_job_naming_no_gpu_type_draws_on_a_typed_quota_with_room() -> None:
    """Flavor fungibility: a team given only typed quotas (``H100=4``) runs a job that names no GPU type on H100s,
    charged to ``H100``; before, it drew on ``*``, which the team lacks, and waited for ever on "nominal 0"."""
    team = TeamInfo(1, "a", quotas=(QuotaInfo("H100", 4),))
    d = plan(snap(pending=(pj(1, 2), pj(2, 2), pj(3, 1)), teams=(team,)))
    assert [a.job_id for a in d.admissions] == [1, 2]  # 2 + 2 GPUs fill H100=4
    (waiting,) = d.pending
    assert waiting.job_id == 3 and waiting.reason == Reason.QUOTA
    assert "the team has no quota for *, and none of its GPU quotas has room for it (H100: 4 in use of 4)" in (
        waiting.message
    )
    # A running untyped job counts against the typed quota of the GPUs it holds.
    running = rj(9, "h0000", [0, 1, 2], team=1, quota_key=quota_key_for(team, 3, None, "H100"))
    assert running.quota_key == "H100"
    assert reasons(snap(pending=(pj(4, 2),), running=(running,), teams=(team,))) == {4: Reason.QUOTA}
    assert admitted(snap(pending=(pj(5, 1),), running=(running,), teams=(team,))) == [5]
    # A team with a quota for * keeps drawing on it; a type the cluster lacks is never chosen.
    assert quota_key_for(TeamInfo(1, "a", quotas=(QuotaInfo(ANY, 4), QuotaInfo("H100", 4))), 1, None, "H100") == ANY
    absent = TeamInfo(1, "a", quotas=(QuotaInfo("B300", 8),))
    assert reasons(snap(pending=(pj(6, 1),), teams=(absent,))) == {6: Reason.QUOTA}


def test_reason_budget_spent_and_projected() -> None:
    team = TeamInfo(1, "a", budget_gpu_hours=10.0, used_gpu_hours=9.0)
    s = snap(pending=(pj(1, 1, estimated_runtime_s=1800.0), pj(2, 4, estimated_runtime_s=3600.0)), teams=(team,))
    assert admitted(s) == [1]  # 0.5 GPU-hours fits; 4 more would not
    assert reasons(s) == {2: Reason.BUDGET}
    spent = snap(pending=(pj(3, 1),), teams=(replace(team, used_gpu_hours=10.0),))
    assert reasons(spent) == {3: Reason.BUDGET}


def test_reason_dependency_and_failed_dependency() -> None:
    s = snap(
        pending=(
            pj(1, depends_on=((7, "RUNNING", "afterok"),)),
            pj(2, depends_on=((8, "FAILED", "afterok"),)),
            pj(3, depends_on=((9, "SUCCEEDED", "afterok"),)),
        )
    )
    d = plan(s)
    assert {p.job_id: p.reason for p in d.pending} == {1: Reason.DEPENDENCY}
    assert [f.job_id for f in d.failures] == [2] and "8" in d.failures[0].message
    assert [a.job_id for a in d.admissions] == [3]


@pytest.mark.parametrize(
    ("condition", "state", "outcome"),
    [
        ("afterany", "RUNNING", "waits"),
        ("afterany", "SUCCEEDED", "runs"),
        ("afterany", "FAILED", "runs"),
        ("afterany", "CANCELLED", "runs"),
        ("afternotok", "RUNNING", "waits"),
        ("afternotok", "FAILED", "runs"),
        ("afternotok", "CANCELLED", "runs"),
        ("afternotok", "SUCCEEDED", "fails"),
        ("afterok", "QUEUED", "waits"),
        ("afterok", "CANCELLED", "fails"),
    ],
)
def test_dependency_conditions(condition: str, state: str, outcome: str) -> None:
    d = plan(snap(pending=(pj(1, depends_on=((7, state, condition),)),)))
    got = "runs" if d.admissions else "fails" if d.failures else "waits"
    assert got == outcome, d
    if outcome == "waits":
        assert d.pending[0].reason == Reason.DEPENDENCY


def test_a_sweep_runs_at_most_max_concurrent_of_its_jobs() -> None:
    """Slurm's %N: room for four jobs, a sweep of four with a limit of 2, one of them already running."""
    sweep = [pj(i, 1, sweep_id=5, sweep_limit=2, age=10 - i) for i in (1, 2, 3)]
    running = (rj(9, "h0", [0], sweep_id=5),)
    d = plan(snap(pending=(*sweep, pj(4, 1)), running=running))
    assert sorted(a.job_id for a in d.admissions) == [1, 4]  # one more of the sweep, and the job outside it
    waiting = {p.job_id: p for p in d.pending}
    assert {j: p.reason for j, p in waiting.items()} == {2: Reason.SWEEP_LIMIT, 3: Reason.SWEEP_LIMIT}
    assert "sweep 5 runs 2 of its jobs at once (max_concurrent 2)" in waiting[2].message
    unlimited = plan(snap(pending=tuple(pj(i, 1, sweep_id=6, age=10 - i) for i in (1, 2, 3))))
    assert len(unlimited.admissions) == 3


def test_a_family_name_is_placed_on_any_of_its_variants_and_a_variant_on_itself_only() -> None:
    """An H100 host registers as H100-80GB; a job asking ``H100`` waited as Unschedulable ("no host has GPU type
    H100") beside idle H100s."""
    hosts = (gpu_host("a", 8, model="H100-80GB"), gpu_host("b", 4, model="H100-PCIE"))
    d = plan(
        snap(
            host_list=hosts,
            pending=(pj(1, 8, gpu_type="H100"), pj(2, 4, gpu_type="H100"), pj(3, 1, gpu_type="H100-80GB-PCIE")),
        )
    )
    assert {a.job_id: a.placement[0].host for a in d.admissions} == {1: "a", 2: "b"}
    assert [(p.job_id, p.reason) for p in d.pending] == [(3, Reason.UNSCHEDULABLE)]


def test_reason_memory_fit_against_qos_cap_and_gpu() -> None:
    s = snap(
        pending=(
            pj(1, memory_bytes=9 * GIB, memory_cap_bytes=8 * GIB),
            pj(2, memory_bytes=100 * GIB),
            pj(3, memory_bytes=40 * GIB),
        )
    )
    assert reasons(s) == {1: Reason.MEMORY_FIT, 2: Reason.MEMORY_FIT}
    assert admitted(s) == [3]


def test_a_gpu_job_on_a_cluster_without_gpus_waits_for_capacity_not_memory() -> None:
    """On ``kiln up`` without a GPU a GPU job used to wait on "MemoryFit: ... the largest eligible GPU has 0.0
    GiB", and ``kiln why`` offered other classes; there is no GPU at all, and the reason says that."""
    d = plan(snap(pending=(pj(1, memory_bytes=11 * GIB),), host_list=(HostInfo("laptop", "host.laptop", cpu_slots=2),)))
    (waiting,) = d.pending
    assert waiting.reason == Reason.UNSCHEDULABLE
    assert waiting.message.startswith("no host has GPUs (the cluster has 2 CPU slots a host, 1 host)"), waiting.message


def test_memory_fit_picks_gpus_large_enough() -> None:
    hosts = (gpu_host("small", 8, memory_bytes=16 * GIB), gpu_host("zbig", 8, memory_bytes=80 * GIB))
    d = plan(snap(host_list=hosts, pending=(pj(1, 2, memory_bytes=40 * GIB),)))
    assert d.admissions[0].placement[0].host == "zbig"


def test_reason_bandwidth_quota() -> None:
    hosts = (gpu_host("h0", 8, links=(("pcie", 32e9),)),)
    s = snap(host_list=hosts, pending=(pj(1, 2, bandwidth=(("pcie", 20e9),)), pj(2, 2, bandwidth=(("pcie", 20e9),))))
    assert admitted(s) == [1]
    d = plan(s)
    assert d.pending[0].reason == Reason.BANDWIDTH_QUOTA and "pcie" in d.pending[0].message


def test_bandwidth_of_running_jobs_counts() -> None:
    hosts = (gpu_host("h0", 8, links=(("pcie", 32e9),)), gpu_host("h1", 8, links=(("pcie", 32e9),)))
    running = (rj(1, "h0", [0], qos="silver", bandwidth=(("pcie", 30e9),)),)
    d = plan(snap(host_list=hosts, running=running, pending=(pj(2, 1, bandwidth=(("pcie", 8e9),)),)))
    assert d.admissions[0].placement[0].host == "h1"


def test_reason_reservation_and_priority() -> None:
    # 8 GPUs, 6 busy until NOW+1000. An 8-GPU head job reserves; a 2-GPU job longer than that cannot backfill.
    running = (rj(1, "h0000", list(range(6)), qos="silver", expected_end=NOW + 1000),)
    s = snap(running=running, pending=(pj(2, 8, age=10, estimated_runtime_s=100), pj(3, 2, estimated_runtime_s=5000)))
    d = plan(s)
    assert {p.job_id: p.reason for p in d.pending} == {2: Reason.RESERVATION, 3: Reason.PRIORITY}
    assert d.reservations[0].job_id == 2 and d.reservations[0].start == NOW + 1000
    assert "job 2" in d.pending[1].message


def test_backfill_never_delays_the_reserved_start() -> None:
    running = (rj(1, "h0000", list(range(6)), qos="silver", expected_end=NOW + 1000),)
    unknown = pj(3, 1)  # no estimate: may not use reserved capacity
    short = pj(4, 2, estimated_runtime_s=900)  # ends before the head's reserved start: may backfill
    d = plan(snap(running=running, pending=(pj(2, 8, age=10, estimated_runtime_s=100), unknown, short)))
    assert [a.job_id for a in d.admissions] == [4] and d.admissions[0].backfilled
    reasons_ = {p.job_id: p.reason for p in d.pending}
    assert reasons_[2] == Reason.RESERVATION and reasons_[3] == Reason.PRIORITY


def test_reservation_takes_the_units_that_free_up_so_others_may_use_the_rest() -> None:
    # The head needs 4; 6 busy units free at NOW+1000: it reserves those, leaving the 2 free ones to a long job.
    running = (rj(1, "h0000", list(range(6)), qos="silver", expected_end=NOW + 1000),)
    d = plan(snap(running=running, pending=(pj(2, 4, age=10), pj(3, 2, estimated_runtime_s=5000))))
    assert [a.job_id for a in d.admissions] == [3]
    assert set(d.reservations[0].gpus) <= {f"GPU-h0000-{i}" for i in range(6)}


def test_backfill_off_blocks_behind_the_head() -> None:
    running = (rj(1, "h0000", list(range(6)), qos="silver", expected_end=NOW + 1000),)
    s = snap(running=running, pending=(pj(2, 4, age=10), pj(3, 1, estimated_runtime_s=10)))
    assert admitted(s, PolicyConfig(backfill=False)) == []
    assert reasons(s, PolicyConfig(backfill=False))[3] == Reason.PRIORITY


def test_restart_backoff_waits() -> None:
    d = plan(snap(pending=(pj(1, not_before=NOW + 30),)))
    assert d.pending[0].reason == Reason.RESOURCES and "backoff" in d.pending[0].message


# -- ordering ----------------------------------------------------------------------------------------------------


def test_qos_priority_order() -> None:
    s = snap(pending=(pj(1, 8, qos="bronze", age=100), pj(2, 8, qos="gold")))
    assert admitted(s) == [2]


def test_fair_share_prefers_the_team_with_less_decayed_usage_per_weight() -> None:
    teams = (TeamInfo(1, "heavy", decayed_usage=1e6), TeamInfo(2, "light", decayed_usage=1e5))
    s = snap(teams=teams, pending=(pj(1, 8, team=1, age=100), pj(2, 8, team=2)))
    assert admitted(s) == [2]
    weighted = (TeamInfo(1, "heavy", decayed_usage=1e6, weight=20.0), teams[1])
    assert admitted(replace(s, teams=weighted)) == [1]


def test_fair_share_alternates_teams_within_a_cycle() -> None:
    teams = (TeamInfo(1, "a"), TeamInfo(2, "b"))
    s = snap(
        hosts=1,
        teams=teams,
        pending=tuple(
            [pj(i, 2, team=1, age=100 - i) for i in range(1, 5)] + [pj(i, 2, team=2, age=50 - i) for i in range(5, 9)]
        ),
    )
    # Admission order: the oldest of team a, then team b (now the lower usage), then a again: not a's four first.
    assert admitted(s) == [1, 5, 2, 6]


def test_at_risk_job_goes_first_and_gets_capacity_reserved() -> None:
    # Both silver; job 2 has waited past half its max queue wait, job 1 has not.
    s = snap(pending=(pj(1, 8, age=5000, max_queue_wait_s=20000.0), pj(2, 8, age=400, max_queue_wait_s=600.0)))
    assert admitted(s) == [2]


def test_deadline_aware_ordering() -> None:
    s = snap(pending=(pj(1, 8, age=100), pj(2, 8, deadline=NOW + 4000, estimated_runtime_s=3600)))
    assert admitted(s) == [2]


def test_fifo_baseline_blocks_behind_the_head() -> None:
    running = (rj(1, "h0000", list(range(6)), qos="silver", expected_end=NOW + 1000),)
    s = snap(running=running, pending=(pj(2, 4, age=10), pj(3, 1, qos="gold")))
    assert admitted(s, PolicyConfig(ordering="fifo", backfill=False)) == []
    assert admitted(s) == [3]


# -- placement ---------------------------------------------------------------------------------------------------


def test_gang_over_hosts_with_gpus_per_node() -> None:
    d = plan(snap(hosts=4, pending=(pj(1, 16, gpus_per_node=4),)))
    place = d.admissions[0].placement
    assert len(place) == 4 and all(len(p.gpus) == 4 for p in place)
    assert [p.node_rank for p in place] == [0, 1, 2, 3]


def test_prefers_one_host_and_packs() -> None:
    running = (rj(1, "h0000", [0, 1, 2, 3, 4, 5], qos="silver"), rj(2, "h0001", [0, 1], qos="silver"))
    d = plan(snap(hosts=3, running=running, pending=(pj(3, 2),)))
    assert [p.host for p in d.admissions[0].placement] == ["h0000"]  # best fit: the fullest host that fits
    spread = plan(snap(hosts=3, running=running, pending=(pj(3, 2),)), PolicyConfig(placement="spread"))
    assert [p.host for p in spread.admissions[0].placement] == ["h0002"]


def test_nvlink_connected_set_and_ring_order() -> None:
    host = gpu_host("p", 8, nvlink="pairs")  # 0-1, 2-3, 4-5, 6-7
    running = (rj(1, "p", [0, 2, 5], qos="silver"),)  # leaves 1, 3, 4, 6, 7
    d = plan(snap(host_list=(host,), running=running, pending=(pj(2, 2),)))
    assert set(d.admissions[0].placement[0].gpus) == {"GPU-p-6", "GPU-p-7"}  # the linked pair, not 1+3
    d4 = plan(snap(host_list=(host,), pending=(pj(3, 4),)))
    ring = d4.admissions[0].placement[0].gpus
    assert ring == ("GPU-p-0", "GPU-p-1", "GPU-p-2", "GPU-p-3")  # neighbours in rank order share NVLink


def test_gpu_type_is_respected_and_excluded_hosts_are_avoided() -> None:
    hosts = (gpu_host("a", 8, model="A100"), gpu_host("b", 8, model="H100", excluded=True), gpu_host("c", 4))
    d = plan(snap(host_list=hosts, pending=(pj(1, 4, gpu_type="H100"), pj(2, 8, gpu_type="H100"))))
    assert [p.host for p in d.admissions[0].placement] == ["c"]
    assert {p.job_id: p.reason for p in d.pending} == {2: Reason.RESOURCES}


def test_a_restart_prefers_other_hosts_than_the_one_it_was_lost_on() -> None:
    # h0000 would be the best fit (the fullest host that fits); the job was lost there, so it goes elsewhere.
    running = (rj(1, "h0000", [0, 1, 2, 3, 4, 5], qos="silver"),)
    lost = pj(2, 2, avoid_hosts=frozenset({"h0000"}))
    assert [p.host for p in plan(snap(hosts=3, running=running, pending=(lost,))).admissions[0].placement] == ["h0001"]
    # A gang over hosts takes the avoided host last.
    gang = pj(3, 16, gpus_per_node=8, avoid_hosts=frozenset({"h0000"}))
    assert {p.host for p in plan(snap(hosts=3, pending=(gang,))).admissions[0].placement} == {"h0001", "h0002"}
    # Soft: where nothing else fits, it restarts there (a one-host cluster still runs it).
    only = plan(snap(hosts=1, pending=(pj(4, 2, avoid_hosts=frozenset({"h0000"})),)))
    assert [p.host for p in only.admissions[0].placement] == ["h0000"]
    cpu = plan(
        snap(
            host_list=(cpu_host("c0", 4), cpu_host("c1", 4)),
            pending=(pj(5, 0, cpu_slots=2, avoid_hosts=frozenset({"c0"})),),
        )
    )
    assert [p.host for p in cpu.admissions[0].placement] == ["c1"]


def test_cpu_jobs_use_slots() -> None:
    hosts = (cpu_host("x", 2), cpu_host("y", 3))
    s = snap(
        host_list=hosts,
        teams=(TeamInfo(1, "a"),),
        pending=(pj(1, 0, cpu_slots=3), pj(2, 0, cpu_slots=2), pj(3, 0, cpu_slots=1, age=-1)),
    )
    d = plan(s)
    place = {a.job_id: [(p.host, p.slots, p.gpus) for p in a.placement] for a in d.admissions}
    assert place == {1: [("y", 3, ())], 2: [("x", 2, ())]}
    assert {p.job_id: p.reason for p in d.pending}[3] in (Reason.RESOURCES, Reason.RESERVATION)


# -- preemption and quotas ---------------------------------------------------------------------------------------


def test_preempts_the_victim_losing_least_work() -> None:
    running = (
        rj(1, "h0000", [0, 1, 2, 3], qos="bronze", last_checkpoint_at=NOW - 3000),
        rj(2, "h0000", [4, 5, 6, 7], qos="bronze", last_checkpoint_at=NOW - 60),
    )
    d = plan(snap(running=running, pending=(pj(3, 4, qos="gold"),)))
    assert [(p.job_id, p.preemptor_id) for p in d.preemptions] == [(2, 3)]
    assert d.pending[0].reason == Reason.RESERVATION and "checkpoint" in d.pending[0].message


def test_no_preemption_before_min_run_time_nor_of_equal_or_higher_class() -> None:
    young = (rj(1, "h0000", list(range(8)), qos="bronze", ran=60),)
    assert plan(snap(running=young, pending=(pj(2, 8, qos="gold"),))).preemptions == ()
    gold = (rj(1, "h0000", list(range(8)), qos="gold"),)
    assert plan(snap(running=gold, pending=(pj(2, 8, qos="gold"),))).preemptions == ()
    silver = (rj(1, "h0000", list(range(8)), team=2, qos="silver"),)  # not preemptible, another team's
    assert plan(snap(running=silver, pending=(pj(2, 8, qos="gold"),))).preemptions == ()


def test_a_team_preempts_its_own_lower_class_jobs_even_when_not_preemptible() -> None:
    """Kueue's withinClusterQueue: LowerPriority. The team's own silver job gives way to its gold job."""
    own = (rj(1, "h0000", list(range(8)), team=1, qos="silver"),)
    d = plan(snap(running=own, pending=(pj(2, 8, team=1, qos="gold"),)))
    assert [(p.job_id, p.preemptor_id) for p in d.preemptions] == [(1, 2)]
    assert "of its own team (gold outranks silver)" in d.preemptions[0].reason
    # Never the other way round, never a job of its own class, and not at all when the policy is off.
    gold = (rj(1, "h0000", list(range(8)), team=1, qos="gold"),)
    assert plan(snap(running=gold, pending=(pj(2, 8, team=1, qos="gold"),))).preemptions == ()
    off = PolicyConfig(preempt_own_lower_classes=False)
    assert plan(snap(running=own, pending=(pj(2, 8, team=1, qos="gold"),)), off).preemptions == ()


def test_in_flight_preemption_is_not_repeated() -> None:
    running = (
        rj(1, "h0000", list(range(8)), qos="bronze", preempt_requested=True, state="PREEMPTING"),
        rj(2, "h0001", list(range(8)), qos="bronze"),
    )
    d = plan(snap(hosts=2, running=running, pending=(pj(3, 8, qos="gold"),)))
    assert d.preemptions == () and d.pending[0].reason == Reason.RESERVATION


def test_reclaims_lent_quota_from_borrower_of_same_class() -> None:
    teams = (
        TeamInfo(1, "lender", cohort="c", quotas=(QuotaInfo(ANY, 8),)),
        TeamInfo(2, "borrower", cohort="c", quotas=(QuotaInfo(ANY, 8),)),
    )
    running = (
        rj(1, "h0000", list(range(8)), team=2, qos="silver"),
        rj(2, "h0001", list(range(8)), team=2, qos="silver"),
    )
    d = plan(snap(hosts=2, teams=teams, running=running, pending=(pj(3, 8, team=1, qos="silver"),)))
    assert len(d.preemptions) == 1 and "reclaimed" in d.preemptions[0].reason
    # A lower-class lender may not reclaim from a gold borrower.
    gold = tuple(replace(r, qos="gold", qos_priority=1000) for r in running)
    d2 = plan(snap(hosts=2, teams=teams, running=gold, pending=(pj(3, 8, team=1, qos="silver"),)))
    assert d2.preemptions == () and d2.pending[0].reason == Reason.QUOTA


def test_borrowing_limit_and_lending_limit() -> None:
    teams = (
        TeamInfo(1, "a", cohort="c", quotas=(QuotaInfo(ANY, 4, borrowing_limit=2),)),
        TeamInfo(2, "b", cohort="c", quotas=(QuotaInfo(ANY, 8, lending_limit=2),)),
    )
    s = snap(hosts=2, teams=teams, pending=(pj(1, 6, team=1), pj(2, 1, team=1)))
    assert admitted(s) == [1]  # 4 own + 2 borrowed (the borrowing limit and the lending limit are both 2)
    assert reasons(s) == {2: Reason.QUOTA}


def test_time_limit_kill() -> None:
    running = (rj(1, "h0000", [0], qos="silver", ran=7200, time_limit_s=3600.0),)
    d = plan(snap(running=running))
    assert [k.job_id for k in d.time_limit_kills] == [1]


def test_the_time_limit_backstop_counts_every_attempt_as_the_worker_does() -> None:
    # 40 min in this attempt after 30 min in earlier ones: past a 1-hour limit and its minute of grace.
    over = rj(1, "h0000", [0], qos="silver", ran=2400, time_limit_s=3600.0, attained_s=1800.0)
    within = rj(2, "h0000", [1], qos="silver", ran=2400, time_limit_s=3600.0, attained_s=1200.0)  # 60 min in all
    d = plan(snap(running=(over, within)))
    assert [k.job_id for k in d.time_limit_kills] == [1]


def test_quota_key_for() -> None:
    t = TeamInfo(1, "a", quotas=(QuotaInfo("H100", 8),))
    assert quota_key_for(t, 0, None) == CPU
    assert quota_key_for(t, 4, "H100") == "H100"
    assert quota_key_for(t, 4, "A100") == ANY
    assert quota_key_for(t, 4, None) == ANY


# -- restart backoff written by the reconciler, preemption patience, per-class reservations, aging ---------------------


def test_reconciler_backoff_becomes_resources_with_the_eligible_time() -> None:
    # The reconciler stores pending_reason="Backoff" (not one of the eight): plan() answers Resources with the time
    # the job becomes eligible, so apply rewrites the stored reason; the message is stable between cycles.
    job = pj(1, 2, not_before=NOW + 90, pending_reason="Backoff")
    first = plan(snap(pending=(job,)))
    assert first.admissions == ()
    (p,) = first.pending
    assert p.reason == Reason.RESOURCES and p.reason in set(Reason) and str(p.reason) != "Backoff"
    assert p.message == "restart backoff: eligible at 1970-01-12 13:48:10Z"
    later = plan(replace(snap(pending=(job,)), now=NOW + 30))
    assert later.pending[0].message == p.message
    # Once not_before has passed, it is admitted like any other job.
    assert [a.job_id for a in plan(replace(snap(pending=(job,)), now=NOW + 90)).admissions] == [1]
    # Backoff is checked before placement: even an idle cluster does not admit it early.
    assert reasons(snap(hosts=4, pending=(job, pj(2, 1))))[1] == Reason.RESOURCES


def test_no_preemption_when_waiting_for_a_running_job_meets_the_sla() -> None:
    # The bronze victim ends in 10 minutes: the gold job (max wait 30 min) waits for it instead of preempting.
    running = (rj(1, "h0000", list(range(8)), qos="bronze", expected_end=NOW + 600),)
    gold = pj(2, 8, qos="gold", max_queue_wait_s=1800.0, estimated_runtime_s=3600.0)
    d = plan(snap(running=running, pending=(gold,)))
    assert d.preemptions == () and d.pending[0].reason == Reason.RESERVATION
    # Ending after the SLA would break: preempt.
    late = (replace(running[0], expected_end=NOW + 7200),)
    assert [p.job_id for p in plan(snap(running=late, pending=(gold,))).preemptions] == [1]
    # The old behaviour on request.
    eager = PolicyConfig(preempt_patience_s=None)
    assert [p.job_id for p in plan(snap(running=running, pending=(gold,)), eager).preemptions] == [1]


def test_the_head_of_each_class_holds_a_reservation() -> None:
    # The silver head reserves the host that frees first; the best-effort head reserves the other one (half free
    # now), so a long small best-effort job cannot take the capacity the large best-effort job waits for.
    running = (
        rj(1, "h0000", list(range(8)), qos="gold", expected_end=NOW + 1000),
        rj(2, "h0001", list(range(4)), qos="gold", expected_end=NOW + 5000),
    )
    pending = (
        pj(10, 8, qos="silver", estimated_runtime_s=3600.0),
        pj(11, 8, qos="best-effort", age=100, estimated_runtime_s=3600.0),
        pj(12, 4, qos="best-effort", estimated_runtime_s=36000.0),
    )
    d = plan(snap(hosts=2, running=running, pending=pending))
    assert [r.job_id for r in d.reservations] == [10, 11]
    got = {p.job_id: p.reason for p in d.pending}
    assert got[10] == got[11] == Reason.RESERVATION and got[12] == Reason.PRIORITY and d.admissions == ()
    # Without per-class reservations the small job backfills onto the free half ahead of job 11.
    old = plan(snap(hosts=2, running=running, pending=pending), PolicyConfig(reserve_per_class=False))
    assert [a.job_id for a in old.admissions] == [12]
    # A short one that ends before the reserved start may still backfill.
    short = replace(pending[2], estimated_runtime_s=600.0)
    assert admitted(snap(hosts=2, running=running, pending=(*pending[:2], short))) == [12]


def test_aging_within_a_class_puts_the_oldest_starved_job_first() -> None:
    # Best-effort has no queue-wait SLA: after starvation_age_s it sorts ahead of fair share, oldest first.
    teams = (TeamInfo(1, "heavy", decayed_usage=1e9), TeamInfo(2, "light"))
    old = pj(1, 8, team=1, qos="best-effort", age=2 * 86400)
    new = pj(2, 8, team=2, qos="best-effort", age=60)
    aging = PolicyConfig(starvation_age_s=86400.0)
    assert admitted(snap(teams=teams, pending=(old, new)), aging) == [1]  # aging after a day
    assert admitted(snap(teams=teams, pending=(old, new))) == [2]  # off by default: fair share


def test_identical_jobs_get_identical_answers() -> None:
    # Jobs of one shape share one answer per state of the cycle (the memo); a different SLA still decides alone.
    running = (rj(1, "h0000", list(range(8)), qos="bronze", expected_end=NOW + 600),)
    pending = tuple(pj(i, 8, qos="gold", estimated_runtime_s=3600.0, age=i) for i in range(2, 40))
    d = plan(snap(running=running, pending=pending, hosts=2))
    assert len(d.admissions) == 1 and len(d.reservations) == 1 and d.preemptions == ()
    rest = {(p.reason, p.message) for p in d.pending if p.reason != Reason.RESERVATION}
    assert len(rest) == 1 and len(d.pending) == len(pending) - 1
    # A job of the same shape whose SLA waiting would break decides for itself (it preempts).
    urgent = replace(pending[-1], id=99, max_queue_wait_s=60.0, submitted_at=NOW - 3000)
    d2 = plan(snap(running=running, pending=(*pending, urgent)))
    assert [(p.job_id, p.preemptor_id) for p in d2.preemptions] == [(1, 99)]


def test_choose_prefers_a_single_exact_fit() -> None:
    from scheduler.policy.preemption import choose
    from scheduler.policy.snapshot import RunningJob

    def job(i: int, gpus: int, started: float) -> RunningJob:
        return RunningJob(
            id=i,
            team_id=1,
            qos="best-effort",
            qos_priority=0,
            preemptible=True,
            gpus=gpus,
            gpu_type="H100",
            quota_key="*",
            placement=(),
            started_at=started,
            last_checkpoint_at=started,
        )

    small = [job(1, 4, 900.0), job(2, 4, 900.0)]
    big = job(3, 8, 0.0)  # more work since its checkpoint, but one job whose GPUs fit exactly

    def fits(victims: object) -> bool:
        return sum(v.gpus for v in victims) >= 8  # type: ignore[attr-defined]

    assert choose([*small, big], fits, now=1000.0, limit=64) == small
    assert choose([*small, big], fits, now=1000.0, limit=64, short=8) == [big]


def test_choose_takes_a_repeatedly_preempted_job_last() -> None:
    from scheduler.policy.preemption import choose
    from scheduler.policy.snapshot import RunningJob

    def job(i: int, started: float, preemptions: int) -> RunningJob:
        return RunningJob(
            id=i,
            team_id=1,
            qos="best-effort",
            qos_priority=0,
            preemptible=True,
            gpus=4,
            gpu_type="H100",
            quota_key="*",
            placement=(),
            started_at=started,
            last_checkpoint_at=started,
            preemptions=preemptions,
        )

    thrashed = job(1, 900.0, 3)  # the least work since its checkpoint, but preempted three times already
    fresh = job(2, 600.0, 0)

    def fits(victims: object) -> bool:
        return sum(v.gpus for v in victims) >= 4  # type: ignore[attr-defined]

    assert choose([thrashed, fresh], fits, now=1000.0, limit=64) == [thrashed]
    assert choose([thrashed, fresh], fits, now=1000.0, limit=64, penalty_s=900.0) == [fresh]
    assert choose([thrashed, fresh], fits, now=1000.0, limit=64, short=4, penalty_s=900.0) == [fresh]
