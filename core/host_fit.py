"""Can any set of hosts ever hold a request? One answer for the submit check and the scheduler's ``Unschedulable``.

"Ever" means with every host empty: what runs, is reserved or is drained now does not count (a drained or down
host may come back, and the job then waits as Resources), only what the hosts have. The rules are the placement's
own (``scheduler/policy/placement.py``): a job's GPUs are all of one type, any type its ``gpu_type`` matches (a
family name such as ``H100`` matches each of its variants: ``core.gpu_types.matches``); a gang without
``gpus_per_node`` (or with one not below its GPUs) takes as many hosts as it needs; with one, it takes that many
GPUs on each of ``gpus // gpus_per_node`` hosts; a CPU job's slots may span hosts too; a fractional job
(``gpu_share``) asks one GPU. GPUs that are unhealthy or in MIG mode are not counted: the scheduler places
nothing on them.

Pure: the submit path builds ``HostCapacity`` from the database (``core.repositories.cluster.capacity``), the
scheduler from its snapshot, and both ask ``Capacity.shortfall``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.gpu_types import matches


@dataclass(frozen=True, slots=True)
class HostCapacity:
    gpus: tuple[tuple[str, int], ...] = ()  # (GPU type, usable GPUs of it)
    cpu_slots: int = 0


@dataclass(frozen=True, slots=True)
class Ask:
    gpus: int  # 0: a CPU job of ``cpu_slots``
    gpu_type: str | None = None  # None: any one type
    gpus_per_node: int | None = None
    cpu_slots: int = 1


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _spread(counts: list[int], unit: str) -> str:
    """``8 GPUs a host, 2 hosts`` when the hosts are alike, else ``20 GPUs on 3 hosts, at most 8 a host``."""
    if len(set(counts)) == 1:
        return f"{_plural(counts[0], unit)} a host, {_plural(len(counts), 'host')}"
    return f"{_plural(sum(counts), unit)} on {len(counts)} hosts, at most {max(counts)} a host"


class Capacity:
    """What a set of hosts can ever hold, summarised once: the scheduler asks for every job shape it meets."""

    def __init__(self, hosts: Iterable[HostCapacity]) -> None:
        self.hosts = 0
        self.per_type: dict[str, list[int]] = {}  # GPU type -> its GPUs on each host that has some
        self.cpu: list[int] = []  # CPU slots of each host that has some
        for h in hosts:
            self.hosts += 1
            for gpu_type, count in h.gpus:
                if count > 0:
                    self.per_type.setdefault(gpu_type, []).append(count)
            if h.cpu_slots > 0:
                self.cpu.append(h.cpu_slots)
        self.total: dict[str, int] = {t: sum(counts) for t, counts in self.per_type.items()}  # on all hosts

    def describe(self) -> str:
        """What the cluster has, in words: ``H200: 8 GPUs a host, 2 hosts; 2 CPU slots a host, 1 host``."""
        parts = [f"{t}: {_spread(c, 'GPU')}" for t, c in sorted(self.per_type.items())]
        if self.cpu:
            parts.append(_spread(self.cpu, "CPU slot"))
        if not self.hosts:
            return "no hosts"
        return "; ".join(parts) or f"{_plural(self.hosts, 'host')} with neither GPUs nor CPU slots"

    def shortfall(self, ask: Ask) -> str | None:
        """Why no set of these hosts, all of them empty, can hold ``ask``, with the largest request they could
        hold of its kind; None when some set can."""
        if ask.gpus == 0:
            total = sum(self.cpu)
            if ask.cpu_slots <= total:
                return None
            if not total:
                return f"no host has CPU slots (the cluster has {self.describe()}): only GPU jobs can run"
            return (
                f"requests {ask.cpu_slots} CPU slots; the whole cluster has {total} ({self.describe()}): ask for at "
                f"most {total}"
            )
        if not self.per_type:
            what = f"GPU type {ask.gpu_type}" if ask.gpu_type else "GPUs"
            return f"no host has {what} (the cluster has {self.describe()}): only CPU jobs (gpus: 0) can run"
        types = self.types_for(ask.gpu_type)
        if not types:
            return f"no host has GPU type {ask.gpu_type} (the cluster has {self.describe()})"
        if any(self._holds(t, ask) for t in types):
            return None
        return self._too_large(ask, types)

    def types_for(self, asked: str | None) -> list[str]:
        """The cluster's GPU types a job asking ``asked`` may run on (every type for None)."""
        return sorted(t for t in self.per_type if asked is None or matches(asked, t))

    def _holds(self, gpu_type: str, ask: Ask) -> bool:
        per_node = ask.gpus_per_node
        if per_node and per_node < ask.gpus:
            return sum(1 for c in self.per_type[gpu_type] if c >= per_node) >= ask.gpus // per_node
        return self.total[gpu_type] >= ask.gpus

    def _too_large(self, ask: Ask, types: list[str]) -> str:
        kind = f"{ask.gpu_type} GPUs" if ask.gpu_type else "GPUs"
        of_one = " of one type" if ask.gpu_type is None or len(types) > 1 else ""  # a family may have several
        have = f"({self.describe()})"
        per_node = ask.gpus_per_node
        if per_node and per_node < ask.gpus:
            hosts = max(sum(1 for c in self.per_type[t] if c >= per_node) for t in types)
            if not hosts:
                most = max(max(self.per_type[t]) for t in types)
                return (
                    f"requests {ask.gpus} {kind}, {per_node} a host; no host has {per_node}{of_one} {have}: ask for "
                    f"at most {most} a host"
                )
            return (
                f"requests {ask.gpus} {kind}, {per_node} a host; the whole cluster has {_plural(hosts, 'host')} with "
                f"{per_node}{of_one} {have}: ask for at most {hosts * per_node}, {per_node} a host"
            )
        most = max(self.total[t] for t in types)
        return f"requests {ask.gpus} {kind}; the whole cluster has {most}{of_one} {have}: ask for at most {most}"
