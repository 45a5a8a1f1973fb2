"""Placement on its own (``scheduler.policy.placement``), case by case: which hosts and which units a request gets,
without the rest of ``plan()`` (quotas, order, preemption) in the way."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from scheduler.policy.placement import Chosen, ClusterState, Request
from scheduler.policy.snapshot import CPU, GpuInfo, HostInfo, PlacedHost, RunningJob
from scheduler.simulate.synthetic import GIB, cpu_host, gpu_host


def running(job_id: int, host: str, gpus: tuple[int, ...], bandwidth: tuple[tuple[str, float], ...] = ()) -> RunningJob:
    return RunningJob(
        id=job_id,
        team_id=1,
        qos="silver",
        qos_priority=1,
        preemptible=True,
        gpus=len(gpus),
        gpu_type="H100",
        quota_key="H100",
        placement=(PlacedHost(host, tuple(f"GPU-{host}-{i}" for i in gpus)),),
        started_at=0.0,
        bandwidth=bandwidth,
    )


def units(host: str, *indices: int) -> tuple[str, tuple[str, ...]]:
    return (host, tuple(f"GPU-{host}-{i}" for i in indices))


def with_sick_gpu(host: HostInfo, index: int) -> HostInfo:
    gpus = tuple(GpuInfo(g.uuid, g.index, g.model, g.memory_bytes, g.nvlink_peers, g.index != index) for g in host.gpus)
    return HostInfo(host.name, host.queue, gpus, host.cpu_slots, host.links, host.excluded)


@dataclass
class Case:
    hosts: tuple[HostInfo, ...]
    request: Request
    want: Chosen | None
    running: tuple[RunningJob, ...] = ()
    spread: bool = False
    check_links: bool = True
    reserve: tuple[tuple[tuple[str, ...], float], ...] = field(default=())  # (units, until)


H100 = ("H100",)

CASES: dict[str, Case] = {
    "packing: the fullest host that fits (best fit)": Case(
        hosts=(gpu_host("a", 8), gpu_host("b", 4)),
        request=Request(H100, 4),
        want=(units("b", 0, 1, 2, 3),),
    ),
    "spreading: the host with the most free": Case(
        hosts=(gpu_host("a", 8), gpu_host("b", 4)),
        request=Request(H100, 4),
        spread=True,
        want=(units("a", 0, 1, 2, 3),),
    ),
    "the GPUs of running jobs are not free": Case(
        hosts=(gpu_host("a", 4),),
        running=(running(7, "a", (0, 1)),),
        request=Request(H100, 2),
        want=(units("a", 2, 3),),
    ),
    "a gang is all or nothing": Case(hosts=(gpu_host("a", 8),), request=Request(H100, 9), want=None),
    "a gang that fits no host: the fewest hosts, the largest first": Case(
        hosts=(gpu_host("a", 4), gpu_host("b", 2), gpu_host("c", 4)),
        request=Request(H100, 8),
        want=(units("a", 0, 1, 2, 3), units("c", 0, 1, 2, 3)),
    ),
    "the remainder goes to the best-fitting host": Case(
        hosts=(gpu_host("a", 8), gpu_host("b", 2), gpu_host("c", 4)),
        request=Request(H100, 10),
        want=(units("a", *range(8)), units("b", 0, 1)),
    ),
    "per node: whole nodes on as many hosts": Case(
        hosts=(gpu_host("a", 8), gpu_host("b", 4), gpu_host("c", 4)),
        request=Request(H100, 8, per_node=4),
        want=(units("b", 0, 1, 2, 3), units("c", 0, 1, 2, 3)),
    ),
    "per node: a host with fewer free than a node is no node": Case(
        hosts=(gpu_host("a", 4), gpu_host("b", 3)),
        request=Request(H100, 8, per_node=4),
        want=None,
    ),
    "another model is not the one asked for": Case(
        hosts=(gpu_host("a", 8, model="A100"), gpu_host("b", 2)),
        request=Request(H100, 4),
        want=None,
    ),
    "models are tried in order": Case(
        hosts=(gpu_host("a", 8, model="A100"), gpu_host("b", 2)),
        request=Request(("H100", "A100"), 2),
        want=(units("b", 0, 1),),
    ),
    "too little memory per GPU": Case(
        hosts=(gpu_host("a", 8, memory_bytes=40 * GIB), gpu_host("b", 8)),
        request=Request(H100, 2, min_memory=64 * GIB),
        want=(units("b", 0, 1),),
    ),
    "an excluded host is not placed on": Case(
        hosts=(gpu_host("a", 4, excluded=True), gpu_host("b", 8)),
        request=Request(H100, 4),
        want=(units("b", 0, 1, 2, 3),),
    ),
    "an unhealthy GPU is skipped": Case(
        hosts=(with_sick_gpu(gpu_host("a", 4), 1),),
        request=Request(H100, 3),
        want=(units("a", 0, 2, 3),),
    ),
    "a host to avoid is used last": Case(
        hosts=(gpu_host("a", 4), gpu_host("b", 4)),
        request=Request(H100, 4, avoid=frozenset({"a"})),
        want=(units("b", 0, 1, 2, 3),),
    ),
    "a host to avoid is still used when nothing else fits": Case(
        hosts=(gpu_host("a", 4), gpu_host("b", 2)),
        request=Request(H100, 4, avoid=frozenset({"a"})),
        want=(units("a", 0, 1, 2, 3),),
    ),
    "NVLink pairs: two GPUs that share a link": Case(
        hosts=(gpu_host("a", 4, nvlink="pairs"),),
        running=(running(7, "a", (0,)),),
        request=Request(H100, 2),
        want=(units("a", 2, 3),),
    ),
    "NVLink: ranks follow the links": Case(
        hosts=(gpu_host("a", 4, nvlink="pairs"),),
        request=Request(H100, 4),
        want=(units("a", 0, 1, 2, 3),),
    ),
    "host links: a full PCIe link refuses a bandwidth quota": Case(
        hosts=(gpu_host("a", 8, links=(("pcie", 10e9),)), gpu_host("b", 8, links=(("pcie", 10e9),))),
        running=(running(7, "a", (0,), bandwidth=(("pcie", 8e9),)),),
        request=Request(H100, 2, bandwidth=(("pcie", 4e9),)),
        want=(units("b", 0, 1),),
    ),
    "host links: ignored when asked to": Case(
        hosts=(gpu_host("a", 8, links=(("pcie", 10e9),)),),
        running=(running(7, "a", (0,), bandwidth=(("pcie", 8e9),)),),
        request=Request(H100, 2, bandwidth=(("pcie", 4e9),)),
        check_links=False,
        want=(units("a", 1, 2),),
    ),
    "CPU slots are units too": Case(
        hosts=(cpu_host("c", 4),),
        request=Request((CPU,), 2),
        want=(("c", ("c/slot0", "c/slot1")),),
    ),
    "reserved GPUs: not for a job that may run past the reservation": Case(
        hosts=(gpu_host("a", 4),),
        reserve=((("GPU-a-0", "GPU-a-1", "GPU-a-2"), 100.0),),
        request=Request(H100, 2),
        want=None,
    ),
    "reserved GPUs: for a job that ends before the reservation starts": Case(
        hosts=(gpu_host("a", 4),),
        reserve=((("GPU-a-0", "GPU-a-1", "GPU-a-2"), 100.0),),
        request=Request(H100, 2, end=50.0),
        want=(units("a", 0, 1),),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_placement(case: Case) -> None:
    state = ClusterState(case.hosts, case.running, spread=case.spread)
    for reserved, until in case.reserve:
        state.reserve(reserved, until, job_id=99)
    assert state.find(case.request, check_links=case.check_links) == case.want


def test_allocating_a_placement_takes_its_units_and_link_capacity() -> None:
    state = ClusterState((gpu_host("a", 4, links=(("pcie", 10e9),)),), ())
    request = Request(H100, 2, bandwidth=(("pcie", 6e9),))
    chosen = state.find(request)
    assert chosen == (units("a", 0, 1),)
    state.allocate(1, chosen, request.bandwidth)
    assert state.job_units[1] == ("GPU-a-0", "GPU-a-1")
    assert state.find(Request(H100, 2)) == (units("a", 2, 3),)
    assert state.find(request) is None  # two GPUs are free, but not 6 GB/s more of the link
