"""TEST DOUBLE ONLY: replays recorded NVML readings from a JSON file, so tests can drive the host agent's
registration and its Xid/ECC health path on machines without a GPU. Never used by the production path
(``workers.inventory.detect_inventory`` returns the real ``NvmlInventory`` or ``NoGpus``).

File format: {"gpus": [GpuInfo fields...], "samples": [[GpuSample fields...], ...]} — one list per sample() call;
the last one repeats.
"""

from __future__ import annotations

import json
from pathlib import Path

from workers.inventory import GpuInfo, GpuSample


class NVMLReplay:
    def __init__(self, path: Path):
        data = json.loads(Path(path).read_text())
        self._gpus = [GpuInfo(**g) for g in data["gpus"]]
        self._samples = [[GpuSample(**s) for s in batch] for batch in data.get("samples", [])]
        self._i = 0

    def discover(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> list[GpuSample]:
        if not self._samples:
            return []
        batch = self._samples[min(self._i, len(self._samples) - 1)]
        self._i += 1
        return batch
