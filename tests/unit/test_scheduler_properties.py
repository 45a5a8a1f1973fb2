"""Hypothesis properties of ``plan()`` over random snapshots."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.policy_config import PolicyConfig
from core.states import Reason
from scheduler.policy.decisions import Decisions
from scheduler.policy.plan import _Planner, plan
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
from scheduler.simulate.synthetic import cpu_host, gpu_host

QOS = [("gold", 1000, False), ("silver", 500, False), ("bronze", 200, True), ("best-effort", 0, True)]
NOW = 100_000.0


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    hosts: list[HostInfo] = []
    for i in range(draw(st.integers(1, 5))):
        if draw(st.booleans()) or i == 0:
            hosts.append(
                gpu_host(
                    f"h{i}",
                    draw(st.sampled_from([2, 4, 8])),
                    model=draw(st.sampled_from(["A100", "H100"])),
                    nvlink=draw(st.sampled_from(["all", "pairs", "none"])),
                    links=(("pcie", 32e9),) if draw(st.booleans()) else (),
                    excluded=draw(st.integers(0, 9)) == 0,
                )
            )
        else:
            hosts.append(cpu_host(f"h{i}", draw(st.integers(1, 6))))
    teams = []
    for tid in range(1, draw(st.integers(1, 4)) + 1):
        quotas: tuple[QuotaInfo, ...] = ()
        if draw(st.booleans()):
            quotas = tuple(
                QuotaInfo(
                    key,
                    draw(st.integers(0, 16)),
                    draw(st.one_of(st.none(), st.integers(0, 8))),
                    draw(st.one_of(st.none(), st.integers(0, 8))),
                )
                for key in draw(st.lists(st.sampled_from([ANY, "H100", CPU]), unique=True, max_size=3))
            )
        teams.append(
            TeamInfo(
                id=tid,
                name=f"t{tid}",
                cohort=draw(st.sampled_from([None, "c1", "c1", "c2"])),
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                quotas=quotas,
                decayed_usage=draw(st.floats(0, 1e6)),
                budget_gpu_hours=draw(st.one_of(st.none(), st.none(), st.none(), st.floats(0, 100))),
                used_gpu_hours=draw(st.floats(0, 100)),
            )
        )
    team_by_id = {t.id: t for t in teams}
    # Running jobs take free units of one host each.
    free = {h.name: [g for g in h.gpus] for h in hosts if not h.excluded}
    slots = {h.name: h.cpu_slots for h in hosts if not h.excluded}
    running: list[RunningJob] = []
    jid = 1
    for _ in range(draw(st.integers(0, 12))):
        h = draw(st.sampled_from(hosts))
        if h.excluded:
            continue
        qname, prio, pre = draw(st.sampled_from(QOS[1:] + QOS[2:]))  # mostly preemptible: victims to choose
        team = draw(st.sampled_from(teams))
        if free.get(h.name):
            k = draw(st.integers(1, len(free[h.name])))
            taken, free[h.name] = free[h.name][:k], free[h.name][k:]
            placement = (PlacedHost(h.name, tuple(g.uuid for g in taken)),)
            units, model, req_type = k, taken[0].model, draw(st.sampled_from([None, taken[0].model]))
        elif slots.get(h.name):
            k = draw(st.integers(1, slots[h.name]))
            slots[h.name] -= k
            placement, units, model, req_type = (PlacedHost(h.name, (), k),), k, CPU, None
        else:
            continue
        started = NOW - draw(st.sampled_from([10.0, 600.0, 7200.0]))
        running.append(
            RunningJob(
                id=jid,
                team_id=team.id,
                qos=qname,
                qos_priority=prio,
                preemptible=pre,
                gpus=units,
                gpu_type=model,
                quota_key=quota_key_for(team, 0 if model == CPU else units, req_type),
                placement=placement,
                started_at=started,
                last_checkpoint_at=draw(st.one_of(st.none(), st.just(started + 5))),
                expected_end=draw(st.one_of(st.none(), st.floats(NOW + 1, NOW + 1e5))),
                preempt_requested=draw(st.integers(0, 5)) == 0,
            )
        )
        jid += 1
    pending: list[PendingJob] = []
    for _ in range(draw(st.integers(0, 12))):
        qname, prio, pre = draw(st.sampled_from(QOS))
        team = draw(st.sampled_from(teams))
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 16]))
        per_node = draw(st.sampled_from([None, 2, 4])) if gpus and gpus % 4 == 0 else None
        gpu_type = draw(st.sampled_from([None, "A100", "H100"])) if gpus else None
        pending.append(
            PendingJob(
                id=jid,
                team_id=team.id,
                qos=qname,
                qos_priority=prio,
                preemptible=pre,
                gpus=gpus,
                submitted_at=NOW - draw(st.floats(0, 10_000)),
                gpus_per_node=per_node,
                gpu_type=gpu_type,
                cpu_slots=draw(st.integers(1, 4)),
                quota_key=quota_key_for(team, gpus, gpu_type),
                max_queue_wait_s=draw(st.one_of(st.none(), st.sampled_from([300.0, 3600.0]))),
                estimated_runtime_s=draw(st.one_of(st.none(), st.floats(60, 10_000))),
                memory_bytes=draw(st.one_of(st.none(), st.none(), st.sampled_from([2**30, 100 * 2**30]))),
                bandwidth=(("pcie", 16e9),) if draw(st.booleans()) else (),
                depends_on=tuple(
                    draw(
                        st.lists(
                            st.tuples(
                                st.integers(1, 3),
                                st.sampled_from(["SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "RUNNING", "FAILED"]),
                                st.sampled_from(["afterok", "afterok", "afterany", "afternotok"]),
                            ),
                            max_size=1,
                        )
                    )
                ),
            )
        )
        jid += 1
    del team_by_id
    return Snapshot(now=NOW, hosts=tuple(hosts), running=tuple(running), pending=tuple(pending), teams=tuple(teams))


def units_of(snapshot: Snapshot) -> dict[str, tuple[str, str, bool]]:
    """unit -> (host, model, usable) for every GPU and CPU slot."""
    out = {}
    for h in snapshot.hosts:
        for g in h.gpus:
            out[g.uuid] = (h.name, g.model, not h.excluded and g.healthy)
        for s in range(h.cpu_slots):
            out[f"{h.name}/slot{s}"] = (h.name, CPU, not h.excluded)
    return out


def check_capacity(snapshot: Snapshot, d: Decisions) -> None:
    pending = {p.id: p for p in snapshot.pending}
    busy = {u for r in snapshot.running for p in r.placement for u in p.gpus}
    slots_used = {h.name: 0 for h in snapshot.hosts}
    for r in snapshot.running:
        for p in r.placement:
            slots_used[p.host] += p.slots
    gpu_info = {g.uuid: (h, g) for h in snapshot.hosts for g in h.gpus}
    host_slots = {h.name: (h.cpu_slots, h.excluded) for h in snapshot.hosts}
    for adm in d.admissions:
        job = pending[adm.job_id]
        # Gangs are atomic: the whole demand, on distinct hosts with distinct node ranks.
        assert sum(p.slots for p in adm.placement) == job.demand
        assert sorted(p.node_rank for p in adm.placement) == list(range(len(adm.placement)))
        assert len({p.host for p in adm.placement}) == len(adm.placement)
        models = set()
        for entry in adm.placement:
            if job.gpus:
                assert len(entry.gpus) == entry.slots
                if job.gpus_per_node and job.gpus_per_node < job.gpus:
                    assert entry.slots == job.gpus_per_node
                for u in entry.gpus:
                    host, gpu = gpu_info[u]
                    assert host.name == entry.host and not host.excluded and gpu.healthy
                    assert u not in busy, "a GPU given twice"
                    busy.add(u)
                    models.add(gpu.model)
                    if job.memory_bytes:
                        assert gpu.memory_bytes >= job.memory_bytes
            else:
                cap, excluded = host_slots[entry.host]
                assert not excluded and not entry.gpus
                slots_used[entry.host] += entry.slots
                assert slots_used[entry.host] <= cap, "more CPU slots than the host has"
        if job.gpus:
            assert len(models) == 1 and (job.gpu_type is None or models == {job.gpu_type})


def check_quotas(snapshot: Snapshot, d: Decisions) -> None:
    """Independent re-computation of the Kueue rules for every team that was admitted something."""
    pending = {p.id: p for p in snapshot.pending}
    teams = {t.id: t for t in snapshot.teams}
    usage: dict[tuple[int, str], int] = {}
    for r in snapshot.running:
        usage[(r.team_id, r.quota_key)] = usage.get((r.team_id, r.quota_key), 0) + r.gpus
    before = dict(usage)
    touched = set()
    model = {g.uuid: g.model for h in snapshot.hosts for g in h.gpus}
    for adm in d.admissions:
        j = pending[adm.job_id]
        # The key it draws on as the live loader sees it running: an untyped job of a team with typed quotas only
        # draws on the type of the GPUs it was placed on (flavor fungibility).
        placed = next((model[u] for e in adm.placement for u in e.gpus), None)
        key = quota_key_for(teams.get(j.team_id), j.gpus, j.gpu_type, placed) if j.quota_key == ANY else j.quota_key
        usage[(j.team_id, key)] = usage.get((j.team_id, key), 0) + j.demand
        touched.add((j.team_id, key))

    def q(tid: int, key: str) -> QuotaInfo:
        return teams[tid].quota(key) or QuotaInfo(key, 0, None, 0)

    def draw(tid: int, key: str, u: int) -> int:
        qi = q(tid, key)
        g = 0 if qi.lending_limit is None else max(0, qi.nominal - qi.lending_limit)
        return max(0, u - g)

    for tid, key in touched:
        if not teams[tid].quotas:
            continue
        qi = q(tid, key)
        if qi.borrowing_limit is not None:
            assert usage[(tid, key)] <= qi.nominal + qi.borrowing_limit
        cohort = teams[tid].cohort
        members = [t.id for t in snapshot.teams if t.quotas and (t.cohort == cohort if cohort else t.id == tid)]
        cap = sum(
            q(m, key).nominal
            - (0 if q(m, key).lending_limit is None else max(0, q(m, key).nominal - (q(m, key).lending_limit or 0)))
            for m in members
        )
        after = sum(draw(m, key, usage.get((m, key), 0)) for m in members)
        prior = sum(draw(m, key, before.get((m, key), 0)) for m in members)
        # Borrowing never goes beyond what the cohort lends (unless the snapshot already did, then not further).
        assert after <= max(cap, prior)


def check_preemptions(snapshot: Snapshot, d: Decisions, config: PolicyConfig) -> None:
    running = {r.id: r for r in snapshot.running}
    pending = {p.id: p for p in snapshot.pending}
    for pre in d.preemptions:
        victim = running[pre.job_id]
        assert pre.preemptor_id is not None
        preemptor = pending[pre.preemptor_id]
        assert victim.qos_priority <= preemptor.qos_priority, "preempted by a lower class"
        if victim.qos == "gold":
            assert preemptor.qos == "gold"
        if victim.team_id == preemptor.team_id:  # never a reclaim: a lower class, and preemptible or allowed
            assert victim.qos_priority < preemptor.qos_priority, "own team's job of the same class"
            assert victim.preemptible or config.preempt_own_lower_classes, "own non-preemptible job taken"
        assert not victim.preempt_requested and victim.state == "RUNNING"
        assert snapshot.now - victim.started_at >= config.min_run_time_s
    assert len({p.job_id for p in d.preemptions}) == len(d.preemptions)


def check_reasons(snapshot: Snapshot, d: Decisions) -> None:
    decided = [a.job_id for a in d.admissions] + [f.job_id for f in d.failures] + [p.job_id for p in d.pending]
    assert sorted(decided) == sorted(p.id for p in snapshot.pending), "each pending job gets one outcome"
    for p in d.pending:
        assert isinstance(p.reason, Reason) and p.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from(["kiln", "fifo"]), st.sampled_from(["pack", "spread"]), st.booleans())
def test_plan_invariants(snapshot: Snapshot, ordering: str, placement: str, own_lower: bool) -> None:
    config = PolicyConfig(ordering=ordering, placement=placement, preempt_own_lower_classes=own_lower)  # type: ignore[arg-type]
    d = plan(snapshot, config)
    check_capacity(snapshot, d)
    check_quotas(snapshot, d)
    check_preemptions(snapshot, d, config)
    check_reasons(snapshot, d)
    # Deterministic: the same snapshot gives the same decisions, and so does the same snapshot re-ordered.
    assert plan(snapshot, config) == d
    shuffled = replace(
        snapshot,
        pending=tuple(reversed(snapshot.pending)),
        hosts=tuple(reversed(snapshot.hosts)),
        teams=tuple(reversed(snapshot.teams)),
    )
    assert plan(shuffled, config) == d


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.floats(0, 200_000))
def test_the_one_trial_projection_agrees_with_the_exact_start(snapshot: Snapshot, ahead: float) -> None:
    # _should_preempt asks "can it start by its limit?" with one placement trial; the answer must be the one the
    # bisection for the exact start (_earliest) gives: start <= limit.
    planner = _Planner(snapshot, PolicyConfig())
    for job in snapshot.pending:
        if job.gpus == 0 or job.share is not None:
            continue
        req = planner._request(job, None)
        limit = snapshot.now + ahead
        assert planner._starts_by(req, limit) == (planner._earliest(req)[1] <= limit)
