"""``core.host_fit``: can any set of hosts ever hold a request? The one answer of the submit check and of the
scheduler's ``Unschedulable``, each shape a row."""

from __future__ import annotations

import pytest

from core.host_fit import Ask, Capacity, HostCapacity

H200_PAIR = Capacity([HostCapacity((("H200", 8),)), HostCapacity((("H200", 8),))])
LAPTOP = Capacity([HostCapacity(cpu_slots=2)])
MIXED = Capacity([HostCapacity((("H100-80GB", 4),), 8), HostCapacity((("H200", 8),)), HostCapacity((("H200", 2),))])


@pytest.mark.parametrize(
    ("capacity", "ask", "expected"),
    [
        (H200_PAIR, Ask(16, "H200"), None),
        (H200_PAIR, Ask(16, None, 8), None),
        (
            H200_PAIR,
            Ask(64, "H200"),
            "requests 64 H200 GPUs; the whole cluster has 16 (H200: 8 GPUs a host, 2 hosts): ask for at most 16",
        ),
        (H200_PAIR, Ask(8, "H300"), "no host has GPU type H300 (the cluster has H200: 8 GPUs a host, 2 hosts)"),
        (
            H200_PAIR,
            Ask(24, "H200", 8),
            "requests 24 H200 GPUs, 8 a host; the whole cluster has 2 hosts with 8 (H200: "
            "8 GPUs a host, 2 hosts): ask for at most 16, 8 a host",
        ),
        (
            H200_PAIR,
            Ask(0, cpu_slots=1),
            "no host has CPU slots (the cluster has H200: 8 GPUs a host, 2 hosts): only GPU jobs can run",
        ),
        (LAPTOP, Ask(0, cpu_slots=2), None),
        (
            LAPTOP,
            Ask(0, cpu_slots=16),
            "requests 16 CPU slots; the whole cluster has 2 (2 CPU slots a host, 1 host): ask for at most 2",
        ),
        (
            LAPTOP,
            Ask(1, "H300"),
            "no host has GPU type H300 (the cluster has 2 CPU slots a host, 1 host): only CPU jobs (gpus: 0) can run",
        ),
        (MIXED, Ask(10, "H200"), None),  # a gang without gpus_per_node spans hosts
        (
            MIXED,
            Ask(12, None),
            "requests 12 GPUs; the whole cluster has 10 of one type (H100-80GB: 4 GPUs a host, "
            "1 host; H200: 10 GPUs on 2 hosts, at most 8 a host; 8 CPU slots a host, 1 host): ask for at most 10",
        ),
        (
            MIXED,
            Ask(8, "H200", 4),
            "requests 8 H200 GPUs, 4 a host; the whole cluster has 1 host with 4 (H100-80GB: 4 GPUs a host, 1 host; "
            "H200: 10 GPUs on 2 hosts, at most 8 a host; 8 CPU slots a host, 1 host): ask for at most 4, 4 a host",
        ),
        (
            MIXED,
            Ask(32, "H200", 16),
            "requests 32 H200 GPUs, 16 a host; no host has 16 (H100-80GB: 4 GPUs a host, "
            "1 host; H200: 10 GPUs on 2 hosts, at most 8 a host; 8 CPU slots a host, 1 host): ask for at most 8 a host",
        ),
        (MIXED, Ask(0, cpu_slots=8), None),
    ],
)
def test_what_the_hosts_can_ever_hold(capacity: Capacity, ask: Ask, expected: str | None) -> None:
    assert capacity.shortfall(ask) == expected
