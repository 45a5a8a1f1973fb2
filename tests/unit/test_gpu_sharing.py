"""Fractional GPUs in ``plan()``: the sharing rules hold over random clusters, and the cases a user meets."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.gpu_types import MPS_MAX_CLIENTS_PER_GPU
from core.states import Reason
from scheduler.policy.decisions import Decisions
from scheduler.policy.plan import plan
from scheduler.policy.snapshot import (
    ANY,
    GpuShare,
    HostInfo,
    PendingJob,
    PlacedHost,
    QuotaInfo,
    RunningJob,
    Snapshot,
    TeamInfo,
)
from scheduler.simulate.synthetic import gpu_host

GIB = 2**30
NOW = 100_000.0
GPU_MEMORY = 80 * GIB
QOS = {"gold": (1000, False), "silver": (500, False), "best-effort": (0, True)}


def pending(jid: int, team: int, qos: str = "gold", *, share: GpuShare | None = None, gpus: int = 1) -> PendingJob:
    priority, preemptible = QOS[qos]
    if share is not None:
        share = replace(share, guaranteed=not preemptible)
    return PendingJob(
        id=jid,
        team_id=team,
        qos=qos,
        qos_priority=priority,
        preemptible=preemptible,
        gpus=gpus,
        submitted_at=NOW - 100 + jid,
        share=share,
    )


def running(
    jid: int, team: int, host: str, gpus: tuple[str, ...], qos: str = "gold", share: GpuShare | None = None
) -> RunningJob:
    priority, preemptible = QOS[qos]
    if share is not None:
        share = replace(share, guaranteed=not preemptible)
    return RunningJob(
        id=jid,
        team_id=team,
        qos=qos,
        qos_priority=priority,
        preemptible=preemptible,
        gpus=len(gpus),
        gpu_type="H100",
        quota_key=ANY,
        placement=(PlacedHost(host, gpus),),
        started_at=NOW - 1000,
        share=share,
    )


def mps_host(name: str, gpus: int = 2, *, mps: bool = True) -> HostInfo:
    return replace(gpu_host(name, gpus, memory_bytes=GPU_MEMORY), mps=mps)


def teams(n: int = 3) -> tuple[TeamInfo, ...]:
    return tuple(TeamInfo(id=i, name=f"t{i}") for i in range(1, n + 1))


def check_rules(snap: Snapshot, d: Decisions) -> None:
    """Every GPU after the cycle: shares within its memory, guaranteed SMs within 100%, one team, no whole-GPU
    job beside a share, shares only on hosts running MPS, at most MPS_MAX_CLIENTS_PER_GPU fractional jobs."""
    memory = {g.uuid: g.memory_bytes for h in snap.hosts for g in h.gpus}
    host_of = {g.uuid: h for h in snap.hosts for g in h.gpus}
    jobs = {j.id: j for j in snap.pending}
    on_gpu: dict[str, list[tuple[int, GpuShare | None]]] = {}
    for r in snap.running:
        for p in r.placement:
            for u in p.gpus:
                on_gpu.setdefault(u, []).append((r.team_id, r.share))
    for adm in d.admissions:
        job = jobs[adm.job_id]
        assert (adm.placement[0].share is not None) == (job.share is not None)
        for entry in adm.placement:
            for u in entry.gpus:
                on_gpu.setdefault(u, []).append((job.team_id, entry.share))
    for uuid, holders in on_gpu.items():
        shares = [s for _, s in holders if s is not None]
        if not shares:
            assert len(holders) == 1, f"{uuid}: two whole-GPU jobs"
            continue
        assert len(shares) == len(holders), f"{uuid}: a whole-GPU job beside a share"
        assert len({t for t, _ in holders}) == 1, f"{uuid}: two teams share a GPU"
        assert sum(s.memory_bytes for s in shares) <= memory[uuid]
        assert sum(s.sm_percent for s in shares if s.guaranteed) <= 100
        assert len(shares) <= MPS_MAX_CLIENTS_PER_GPU
        assert host_of[uuid].mps
    admitted_shares = {a.job_id for a in d.admissions if a.placement[0].share is not None}
    for adm in d.admissions:
        if adm.job_id in admitted_shares:
            assert host_of[adm.placement[0].gpus[0]].mps


shares = st.builds(
    GpuShare,
    memory_bytes=st.sampled_from([4, 10, 20, 40, 80]).map(lambda g: g * GIB),
    sm_percent=st.sampled_from([10, 30, 50, 70, 100]),
    guaranteed=st.just(True),
)


@st.composite
def sharing_snapshots(draw: st.DrawFn) -> Snapshot:
    hosts = [
        mps_host(f"h{i}", draw(st.integers(1, 3)), mps=draw(st.booleans()) or i == 0)
        for i in range(draw(st.integers(1, 3)))
    ]
    run: list[RunningJob] = []
    jid = 1
    for h in hosts:
        for g in h.gpus:
            kind = draw(st.sampled_from(["free", "free", "whole", "shared"]))
            if kind == "whole":
                run.append(running(jid, draw(st.integers(1, 3)), h.name, (g.uuid,)))
                jid += 1
            elif kind == "shared" and h.mps:
                team, used, sm = draw(st.integers(1, 3)), 0, 0
                for _ in range(draw(st.integers(1, 3))):
                    s = draw(shares)
                    if used + s.memory_bytes > g.memory_bytes or sm + s.sm_percent > 100:
                        break
                    used, sm = used + s.memory_bytes, sm + s.sm_percent
                    run.append(running(jid, team, h.name, (g.uuid,), share=s))
                    jid += 1
    queue = []
    for _ in range(draw(st.integers(1, 14))):
        qos = draw(st.sampled_from(list(QOS)))
        share = draw(st.one_of(st.none(), shares, shares))
        queue.append(
            pending(jid, draw(st.integers(1, 3)), qos, share=share, gpus=1 if share else draw(st.integers(1, 2)))
        )
        jid += 1
    return Snapshot(now=NOW, hosts=tuple(hosts), running=tuple(run), pending=tuple(queue), teams=teams())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sharing_snapshots())
def test_sharing_rules_hold_over_random_clusters(snap: Snapshot) -> None:
    check_rules(snap, plan(snap))


def test_small_jobs_of_a_team_pack_onto_one_gpu_and_a_whole_gpu_job_takes_the_other() -> None:
    quarter = GpuShare(20 * GIB, 25, True)
    queue = (*(pending(i, 1, share=quarter) for i in range(1, 5)), pending(5, 1))
    snap = Snapshot(now=NOW, hosts=(mps_host("a", 2),), pending=queue, teams=teams())
    d = plan(snap)
    check_rules(snap, d)
    gpus = {a.job_id: a.placement[0].gpus for a in d.admissions}
    assert len({gpus[i] for i in range(1, 5)}) == 1  # four quarter-GPU jobs on one GPU
    assert gpus[5] != gpus[1]  # the whole-GPU job on the other


def test_guaranteed_sm_never_passes_100_percent_but_best_effort_fills_what_is_left() -> None:
    seventy = GpuShare(10 * GIB, 70, True)
    queue = (pending(1, 1, share=seventy), pending(2, 1, share=seventy), pending(3, 1, "best-effort", share=seventy))
    snap = Snapshot(now=NOW, hosts=(mps_host("a", 1),), pending=queue, teams=teams())
    d = plan(snap)
    assert sorted(a.job_id for a in d.admissions) == [1, 3]
    (waiting,) = [p for p in d.pending if p.job_id == 2]
    assert waiting.reason is Reason.RESOURCES
    assert "no GPU has room for a share of 10.0 GiB and 70% of the SMs (guaranteed)" in waiting.message


def test_teams_never_share_a_gpu_and_a_host_without_mps_takes_no_share() -> None:
    half = GpuShare(40 * GIB, 50, True)
    queue = (pending(1, 1, share=half), pending(2, 2, share=half), pending(3, 2, share=half))
    snap = Snapshot(now=NOW, hosts=(mps_host("a", 1), mps_host("b", 2, mps=False)), pending=queue, teams=teams())
    d = plan(snap)
    check_rules(snap, d)
    assert [a.job_id for a in d.admissions] == [1]  # team 2 finds no other MPS GPU; host b runs no MPS
    assert {p.job_id for p in d.pending} == {2, 3}


def test_a_shared_gpu_is_one_gpu_of_its_teams_quota() -> None:
    quarter = GpuShare(20 * GIB, 25, True)
    team = TeamInfo(id=1, name="t1", quotas=(QuotaInfo(ANY, 1),))
    held = (running(1, 1, "a", ("GPU-a-0",), share=quarter), running(2, 1, "a", ("GPU-a-0",), share=quarter))
    queue = (pending(3, 1, share=quarter), pending(4, 1))
    snap = Snapshot(now=NOW, hosts=(mps_host("a", 2),), running=held, pending=queue, teams=(team,))
    d = plan(snap)
    assert [a.job_id for a in d.admissions] == [3]  # joins the team's shared GPU: no more quota
    (whole,) = [p for p in d.pending if p.job_id == 4]
    assert whole.reason is Reason.QUOTA  # the shared GPU already is the team's one GPU
