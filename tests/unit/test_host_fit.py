"""``core.host_fit``: can any set of hosts ever hold a request? The one answer of the submit check and of the
scheduler's ``Unschedulable``, each shape a row."""

from __future__ import annotations

import re

import pytest

from core.gpu_types import matches, variants_pattern
from core.host_fit import Ask, Capacity, HostCapacity

H200_PAIR = Capacity([HostCapacity((("H200", 8),)), HostCapacity((("H200", 8),))])
LAPTOP = Capacity([HostCapacity(cpu_slots=2)])
H100S = Capacity([HostCapacity((("H100-80GB", 8),)), HostCapacity((("H100-PCIE", 4),))])
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
        # A family name matches any of its variants (an H100 host registers as H100-80GB); a variant only itself.
        (MIXED, Ask(4, "H100"), None),
        (H100S, Ask(8, "H100", 8), None),
        (
            H100S,
            Ask(16, "H100"),
            "requests 16 H100 GPUs; the whole cluster has 8 of one type (H100-80GB: 8 GPUs a host, 1 host; "
            "H100-PCIE: 4 GPUs a host, 1 host): ask for at most 8",
        ),
        (
            H100S,
            Ask(8, "H100-PCIE"),
            "requests 8 H100-PCIE GPUs; the whole cluster has 4 (H100-80GB: 8 GPUs a host, 1 host; "
            "H100-PCIE: 4 GPUs a host, 1 host): ask for at most 4",
        ),
        (
            H100S,
            Ask(1, "H100-40GB"),
            "no host has GPU type H100-40GB (the cluster has H100-80GB: 8 GPUs a host, "
            "1 host; H100-PCIE: 4 GPUs a host, 1 host)",
        ),
        (H200_PAIR, Ask(1, "H100"), "no host has GPU type H100 (the cluster has H200: 8 GPUs a host, 2 hosts)"),
    ],
)
def test_what_the_hosts_can_ever_hold(capacity: Capacity, ask: Ask, expected: str | None) -> None:
    assert capacity.shortfall(ask) == expected


@pytest.mark.parametrize(
    ("asked", "gpu_type", "expected"),
    [
        ("H100", "H100-80GB", True),
        ("H100", "H100-80GB-PCIE", True),
        ("H100", "H100", True),
        ("H200", "H200-NVL", True),
        ("A100", "A100-40GB", True),
        ("H100-80GB", "H100-80GB", True),
        ("H100-80GB", "H100-80GB-PCIE", False),  # a variant stays exact
        ("H100-80GB", "H100", False),
        ("H100", "H200", False),
        ("H10", "H100-80GB", False),
        ("RTX", "RTX-4090", False),  # a model's own words are not a variant
    ],
)
def test_a_family_name_matches_its_variants_and_a_variant_itself(asked: str, gpu_type: str, expected: bool) -> None:
    assert matches(asked, gpu_type) is expected
    pattern = variants_pattern(asked)
    assert (asked == gpu_type or (pattern is not None and re.search(pattern, gpu_type) is not None)) is expected
