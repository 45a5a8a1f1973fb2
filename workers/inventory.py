"""GPU inventory and health through NVML: what a host has, and periodic samples of how it is doing.

A host without NVML (no driver, no GPU) has no GPUs here and offers CPU slots instead. The host agent depends
only on the ``Inventory`` protocol; production uses ``NvmlInventory``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    index: int
    model: str
    memory_bytes: int
    mig_mode: bool
    pcie_gen: int | None
    nvlink_peers: list[str] = field(default_factory=list)
    minor: int | None = None  # its device node is /dev/nvidia<minor> (what a sandbox binds for the GPU)


@dataclass(frozen=True)
class GpuSample:
    """One reading; ``None`` means "not measurable here" (absent link, unsupported counter), never zero."""

    uuid: str
    ts: float
    utilization_pct: float | None
    memory_used_bytes: int | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    nvlink_tx_bytes_per_s: float | None
    nvlink_rx_bytes_per_s: float | None
    temperature_c: float | None
    ecc_uncorrected: int | None
    xid_errors: list[int] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """Hardware errors that make the GPU untrustworthy (the reconciler excludes its host)."""
        out = [f"Xid {x}" for x in self.xid_errors]
        if self.ecc_uncorrected:
            out.append(f"{self.ecc_uncorrected} uncorrected ECC errors")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "utilization_pct": self.utilization_pct,
            "memory_used_bytes": self.memory_used_bytes,
            "pcie_tx_bytes_per_s": self.pcie_tx_bytes_per_s,
            "pcie_rx_bytes_per_s": self.pcie_rx_bytes_per_s,
            "nvlink_tx_bytes_per_s": self.nvlink_tx_bytes_per_s,
            "nvlink_rx_bytes_per_s": self.nvlink_rx_bytes_per_s,
            "temperature_c": self.temperature_c,
            "ecc_uncorrected": self.ecc_uncorrected,
            "xid_errors": list(self.xid_errors),
            "errors": self.errors,
        }


class Inventory(Protocol):
    def discover(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...


class NvmlInventory:
    """The real thing (``nvidia-ml-py``). Xid errors arrive through an NVML event set, drained on each sample."""

    def __init__(self) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self._handles: list[Any] = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._uuids = [self._str(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._ecc_baseline: dict[str, int] = {}
        self._nvlink_prev: dict[str, tuple[float, float, float]] = {}
        self._events: Any = None
        with contextlib.suppress(pynvml.NVMLError):
            self._events = pynvml.nvmlEventSetCreate()
            for h in self._handles:
                with contextlib.suppress(pynvml.NVMLError):  # not every GPU (or MIG mode) supports events
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._events)

    @staticmethod
    def _str(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError:
            return None

    def _nvlink_peers(self, handle: Any, bus_to_uuid: dict[str, str]) -> list[str]:
        nv = self.nv
        peers: set[str] = set()
        via_switch = False
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            if self._try(nv.nvmlDeviceGetNvLinkState, handle, link) != nv.NVML_FEATURE_ENABLED:
                continue
            remote = self._try(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is None:
                continue
            bus = self._str(remote.busId).lower()
            if bus in bus_to_uuid:
                peers.add(bus_to_uuid[bus])
            else:
                via_switch = True  # NVSwitch: every GPU with an active link is one hop away
        if via_switch:
            peers.update(bus_to_uuid.values())
        return sorted(peers)

    def discover(self) -> list[GpuInfo]:
        nv = self.nv
        bus_to_uuid = {}
        for h, uuid in zip(self._handles, self._uuids, strict=True):
            pci = self._try(nv.nvmlDeviceGetPciInfo, h)
            if pci is not None:
                bus_to_uuid[self._str(pci.busId).lower()] = uuid
        gpus = []
        for i, (h, uuid) in enumerate(zip(self._handles, self._uuids, strict=True)):
            mig = self._try(nv.nvmlDeviceGetMigMode, h)
            peers = [p for p in self._nvlink_peers(h, bus_to_uuid) if p != uuid]
            gpus.append(
                GpuInfo(
                    uuid=uuid,
                    index=i,
                    model=self._str(nv.nvmlDeviceGetName(h)),
                    memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
                    mig_mode=bool(mig and mig[0] == nv.NVML_DEVICE_MIG_ENABLE),
                    pcie_gen=self._try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    nvlink_peers=peers,
                    minor=self._try(nv.nvmlDeviceGetMinorNumber, h),
                )
            )
        return gpus

    def _drain_xids(self) -> dict[str, list[int]]:
        nv = self.nv
        out: dict[str, list[int]] = {}
        if self._events is None:
            return out
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: no more events
                return out
            uuid = self._str(nv.nvmlDeviceGetUUID(data.device))
            out.setdefault(uuid, []).append(int(data.eventData))

    def _nvlink_throughput(self, uuid: str, handle: Any) -> tuple[float | None, float | None]:
        nv = self.nv
        fields = [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        values = self._try(nv.nvmlDeviceGetFieldValues, handle, fields)
        if not values or any(v.nvmlReturn != nv.NVML_SUCCESS for v in values):
            return None, None  # no NVLink here: absent, not zero
        # Cumulative KiB counters: a rate needs two readings (the first sample has none).
        now = time.monotonic()
        tx, rx = float(values[0].value.ullVal) * 1024, float(values[1].value.ullVal) * 1024
        prev = self._nvlink_prev.get(uuid)
        self._nvlink_prev[uuid] = (now, tx, rx)
        if prev is None or now <= prev[0]:
            return None, None
        dt = now - prev[0]
        return max(0.0, (tx - prev[1]) / dt), max(0.0, (rx - prev[2]) / dt)

    def sample(self) -> list[GpuSample]:
        nv = self.nv
        xids = self._drain_xids()
        out = []
        for h, uuid in zip(self._handles, self._uuids, strict=True):
            util = self._try(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
            tx = self._try(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)  # KB/s over 20 ms
            rx = self._try(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
            nvl_tx, nvl_rx = self._nvlink_throughput(uuid, h)
            ecc = self._try(
                nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )
            new_ecc = None
            if ecc is not None:
                base = self._ecc_baseline.setdefault(uuid, int(ecc))
                new_ecc = int(ecc) - base  # only errors since this agent started count against the host
            out.append(
                GpuSample(
                    uuid=uuid,
                    ts=time.time(),
                    utilization_pct=float(util.gpu) if util else None,
                    memory_used_bytes=int(mem.used) if mem else None,
                    pcie_tx_bytes_per_s=tx * 1000.0 if tx is not None else None,
                    pcie_rx_bytes_per_s=rx * 1000.0 if rx is not None else None,
                    nvlink_tx_bytes_per_s=nvl_tx,
                    nvlink_rx_bytes_per_s=nvl_rx,
                    temperature_c=self._try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    ecc_uncorrected=new_ecc,
                    xid_errors=xids.get(uuid, []),
                )
            )
        return out


class NoGpus:
    """A host without NVML: it offers CPU slots."""

    def discover(self) -> list[GpuInfo]:
        return []

    def sample(self) -> list[GpuSample]:
        return []


def local_gpus() -> list[GpuInfo]:
    """What NVML finds on this host, without keeping NVML open (``kiln up`` reports it at start)."""
    inv = detect_inventory()
    try:
        return inv.discover()
    finally:
        if isinstance(inv, NvmlInventory):
            with contextlib.suppress(Exception):
                inv.nv.nvmlShutdown()


def detect_inventory() -> Inventory:
    try:
        inv = NvmlInventory()
    except Exception as exc:  # ImportError, NVMLError (no driver / no GPU): a CPU host
        log.info("NVML not available (%s): offering CPU slots", exc)
        return NoGpus()
    if not inv._handles:
        return NoGpus()
    return inv
