"""Where a compile's cached artifacts come from and where they go: the team's tier and the admin's shared tier on
kiln's storage (``core.compile_cache``), through torch's portable cache (``torch.compiler.save_cache_artifacts`` /
``load_cache_artifacts``: Inductor's FX-graph and AOTAutograd entries, and on a GPU the Triton kernels with them).

The job's own directory (``KILN_COMPILE_CACHE_DIR``) keeps Inductor's and Triton's on-disk caches for a restart of
the same job on the same storage; this module is what every other job and host of the team reuses.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import time
from typing import Any

import torch

from core import compile_cache as store
from core.telemetry import Telemetry
from core.trainer_protocol import ENV_ATTEMPT_ID, ENV_JOB_ID, ENV_SHARED_COMPILE_CACHE_DIR, ENV_TEAM_COMPILE_CACHE_DIR

TEAM = "team"
SHARED = "shared"


def cache_fields(
    *,
    mode: str,
    model_config: dict[str, Any],
    precision: str,
    device: torch.device,
    world_size: int,
    strategy: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything that decides the compiled code, and so the key of its cache entry: the compiler stack (torch,
    Triton, CUDA, Python: Dynamo traces its bytecode), the GPU (name, capability and MPS SM cap: kernels and
    autotuning are per architecture and SM count), the compile options (the GEMM backend among them), the
    precision, the model's graph (``Recipe.graph_config``: its hyperparameters but the optimiser's, whose changes
    leave the graph as it is), and the world size and parallelism. A field left out that did change the graph costs
    no correctness: Inductor's own entries are keyed by the graph's hash, so they would miss, and the compiled step
    is compared with eager before use."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    gpu: dict[str, Any] = {}
    if device.type == "cuda":
        gpu = {
            "name": torch.cuda.get_device_name(device),
            "capability": list(torch.cuda.get_device_capability(device)),
            "cuda": torch.version.cuda,
            # An MPS client's SM cap: Triton's autotuning under it chooses for the SMs it may use.
            "sm_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        }
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "device": device.type,
        "gpu": gpu,
        "mode": mode,
        "options": {"fullgraph": True, "dynamic": False, **(extra or {})},
        "precision": precision,
        "graph": model_config,
        "world_size": world_size,
        "parallelism": strategy,
    }


@dataclasses.dataclass(frozen=True)
class Loaded:
    source: str  # team | shared
    root: pathlib.Path
    entry: store.Entry


@dataclasses.dataclass(frozen=True)
class Tiers:
    """The team's tier (read-write: the only one a trainer publishes to) and the shared one (read-only), if any."""

    team: pathlib.Path | None
    shared: pathlib.Path | None

    @classmethod
    def from_env(cls, job_cache_dir: pathlib.Path | None) -> Tiers:
        """The worker names both; a bare run (no worker) keeps its team tier beside its job cache."""
        team = os.environ.get(ENV_TEAM_COMPILE_CACHE_DIR)
        shared = os.environ.get(ENV_SHARED_COMPILE_CACHE_DIR)
        return cls(
            team=pathlib.Path(team) if team else (job_cache_dir / "team" if job_cache_dir else None),
            shared=pathlib.Path(shared) if shared else None,
        )

    def roots(self) -> list[tuple[str, pathlib.Path]]:
        return [(source, root) for source, root in ((TEAM, self.team), (SHARED, self.shared)) if root is not None]

    def load(self, key: str, tel: Telemetry) -> Loaded | None:
        """The first entry for ``key`` that passes its checks, installed into torch's caches; a failing one is
        rejected (event) and, in the team's tier, discarded."""
        for source, root in self.roots():
            try:
                found = store.read(root, key)
            except store.Rejected as exc:
                self.reject(tel, Loaded(source, root, _unread(key)), str(exc), check=exc.check)
                continue
            except OSError as exc:  # storage trouble costs a cold compile, nothing more
                tel.event("COMPILE_CACHE_UNREADABLE", f"compile cache {root / key}: {exc!r}", path=str(root / key))
                continue
            if found is None:
                continue
            entry, blob = found
            if torch.compiler.load_cache_artifacts(blob) is None:  # torch logs and returns None on a bad blob
                self.reject(tel, Loaded(source, root, entry), "torch could not load the artifacts", check="load")
                continue
            store.touch(root, key)
            return Loaded(source, root, entry)
        return None

    def reject(self, tel: Telemetry, loaded: Loaded, reason: str, *, check: str) -> None:
        """``COMPILE_CACHE_REJECTED``; a team entry is discarded (the shared tier is the admin's, read-only here)."""
        key = loaded.entry.key
        discarded = loaded.source == TEAM and store.discard(loaded.root, key)
        tel.event(
            "COMPILE_CACHE_REJECTED",
            f"compile cache entry {key} ({loaded.source}) rejected: {reason}",
            cache_key=key,
            cache_source=loaded.source,
            reason=reason,
            check=check,
            discarded=discarded,
            path=str(loaded.root / key),
        )

    def publish(self, fields: dict[str, Any], cold_s: float, tel: Telemetry) -> None:
        """This compile's artifacts as the team's entry for its key, unless another writer was first."""
        if self.team is None:
            return
        try:
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                return
            entry = store.Entry.for_blob(
                fields,
                saved[0],
                job_id=os.environ.get(ENV_JOB_ID),
                attempt=os.environ.get(ENV_ATTEMPT_ID),
                cold_compile_s=round(cold_s, 3),
            )
            t0 = time.perf_counter()
            if not store.publish(self.team, entry, saved[0]):
                return  # first writer wins: the entry there is as good as ours
        except Exception as exc:  # a cache that cannot be written costs the next job a cold compile, nothing more
            tel.event("COMPILE_CACHE_SAVE_FAILED", f"could not publish the compile cache: {exc!r}")
            return
        tel.event(
            "COMPILE_CACHE_PUBLISHED",
            f"compile cache entry {entry.key} published for the team ({entry.size_bytes} bytes)",
            cache_key=entry.key,
            bytes=entry.size_bytes,
            sha256=entry.sha256,
            cold_compile_s=entry.cold_compile_s,
            publish_s=round(time.perf_counter() - t0, 3),
            path=str(self.team / entry.key),
        )


def _unread(key: str) -> store.Entry:
    """A stand-in for an entry whose ``entry.json`` could not be trusted: only its key is known."""
    return store.Entry(
        key=key,
        fields={},
        sha256="",
        size_bytes=0,
        torch=None,
        triton=None,
        job_id=None,
        attempt=None,
        written_at=0.0,
        cold_compile_s=None,
    )


def forget_recorded_artifacts() -> None:
    """torch records every artifact its caches save or hit since the process started, and
    ``save_cache_artifacts`` returns them all: start each compile from none, so a published entry holds this
    compile's artifacts only (never those of an entry rejected a moment before)."""
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()
