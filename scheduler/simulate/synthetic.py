"""Builders of synthetic clusters and snapshots: for the tests, the benchmark and the simulator's synthetic trace."""

from __future__ import annotations

from scheduler.policy.snapshot import GpuInfo, HostInfo

GIB = 2**30


def gpu_host(
    name: str,
    gpus: int = 8,
    *,
    model: str = "H100",
    memory_bytes: int = 80 * GIB,
    nvlink: str = "all",
    links: tuple[tuple[str, float], ...] = (),
    excluded: bool = False,
    cpu_slots: int = 0,
) -> HostInfo:
    """A GPU host. ``nvlink``: "all" (an NVSwitch: every pair linked), "pairs" (0-1, 2-3, ...) or "none"."""
    uuids = [f"GPU-{name}-{i}" for i in range(gpus)]

    def peers(i: int) -> tuple[str, ...]:
        if nvlink == "all":
            return tuple(u for j, u in enumerate(uuids) if j != i)
        if nvlink == "pairs":
            j = i ^ 1
            return (uuids[j],) if j < gpus else ()
        return ()

    return HostInfo(
        name=name,
        queue=f"host.{name}",
        gpus=tuple(GpuInfo(uuids[i], i, model, memory_bytes, peers(i)) for i in range(gpus)),
        cpu_slots=cpu_slots,
        links=links,
        excluded=excluded,
    )


def cpu_host(name: str, slots: int = 4) -> HostInfo:
    return HostInfo(name=name, queue=f"host.{name}", cpu_slots=slots)


def gpu_cluster(hosts: int, gpus_per_host: int = 8, *, model: str = "H100", prefix: str = "h") -> tuple[HostInfo, ...]:
    return tuple(gpu_host(f"{prefix}{i:04d}", gpus_per_host, model=model) for i in range(hosts))
