"""The environment an attempt's ranks start with, built from nothing (never the worker's own), and where the job's
fast local tier lies on this host."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from core.deployment import local_tier_jobs
from core.models import GPU, QosClass
from core.settings import Settings
from core.trainer_protocol import (
    ENV_ATTEMPT_ID,
    ENV_CHECKPOINT_DIR,
    ENV_CKPT_WRITERS,
    ENV_COMPILE_CACHE_DIR,
    ENV_FENCING_TOKEN,
    ENV_FINAL_CHECKPOINT_RETRY_S,
    ENV_JOB_ID,
    ENV_LEASE_FILE,
    ENV_LOCAL_CHECKPOINT_DIR,
    ENV_MEMORY_FRACTION,
    ENV_SHARED_COMPILE_CACHE_DIR,
    ENV_TEAM_COMPILE_CACHE_DIR,
    ENV_TEST_HOOKS,
)
from workers import mps, worker_state
from workers.claimed import Claimed
from workers.cpu_budget import cpu_threads_per_rank

NCCL_MAX_CHANNELS = 32
HOST_ENV = ("LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
HOST_ENV_PREFIXES = ("LC_", "NCCL_", "GLOO_", "NVIDIA_")
DEFAULT_LINK_BYTES_PER_S = {"pcie": 64 * 10**9, "nvlink": 900 * 10**9}  # PCIe 5 x16; H100/H200 NVLink 4


def _nccl_channels(qos: QosClass | None, links: dict[str, Any], gpus: list[GPU]) -> int | None:
    """A bandwidth quota as an NCCL channel limit: the quota's share of the link, of NCCL's 32 channels."""
    if qos is None or not gpus:
        return None
    shares = []
    for kind, quota in (("pcie", qos.pcie_bandwidth_bytes_per_s), ("nvlink", qos.nvlink_bandwidth_bytes_per_s)):
        if not quota:
            continue
        if kind == "nvlink" and not any(g.nvlink_peers for g in gpus):
            continue
        capacity = float(links.get(f"{kind}_bytes_per_s") or DEFAULT_LINK_BYTES_PER_S[kind])
        shares.append(min(1.0, quota / capacity))
    if not shares:
        return None
    return max(1, min(NCCL_MAX_CHANNELS, int(NCCL_MAX_CHANNELS * min(shares))))


def _from_host() -> dict[str, str]:
    """What the attempt takes from the host: the locale, time zone and library path, and the operator's
    NCCL/gloo/NVIDIA tuning of the host's network and devices; a PATH of its own."""
    env = {k: v for k, v in os.environ.items() if k in HOST_ENV or k.startswith(HOST_ENV_PREFIXES)}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
    if ENV_TEST_HOOKS in os.environ:  # the test harness's fault injection reaches the ranks only this way
        env[ENV_TEST_HOOKS] = os.environ[ENV_TEST_HOOKS]
    return env


def _share_env(share: dict[str, Any], fraction: float) -> dict[str, str]:
    """A fractional job: its share is what MPS enforces (memory pinned, SMs capped), as this GPU's client."""
    memory = int(share["memory_bytes"])
    env = {
        ENV_MEMORY_FRACTION: f"{fraction:.6f}",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory // 2**20}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(int(share["sm_percent"])),
        # A best-effort share fills idle SMs: below-normal MPS priority lets a guaranteed neighbour's kernels go
        # first (the H200 run: a gold job kept 0.72x of alone beside a 30% best-effort job at equal priority).
        "CUDA_MPS_CLIENT_PRIORITY": "0" if share.get("guaranteed") else "1",
    }
    if mps.DAEMON is not None:
        env.update(mps.DAEMON.client_env())
    return env


def _qos_env(claimed: Claimed, qos: QosClass) -> dict[str, str]:
    """Whole GPUs under a QoS class: its memory cap, SM percentage and bandwidth quota."""
    env: dict[str, str] = {}
    smallest = min(g.memory_bytes for g in claimed.gpus)
    if qos.gpu_memory_cap_bytes:
        env[ENV_MEMORY_FRACTION] = f"{min(1.0, qos.gpu_memory_cap_bytes / smallest):.6f}"
        mib = qos.gpu_memory_cap_bytes // 2**20
        # Index-based (as the client sees the devices after CUDA_VISIBLE_DEVICES); enforced where MPS runs.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i in range(len(claimed.gpus)))
    else:
        env[ENV_MEMORY_FRACTION] = "1.0"
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(qos.sm_percent)
    channels = _nccl_channels(qos, claimed.host_links, claimed.gpus)
    if channels is not None:
        env["NCCL_MAX_NCHANNELS"] = str(channels)
    return env


def _gpu_env(claimed: Claimed) -> dict[str, str]:
    """A GPU attempt's CPU threads per rank and its GPU limits (a share's, or its QoS class's)."""
    share = next((n["share"] for n in claimed.placement if n.get("share")), None)
    # A share's part of its one GPU, by memory (what MPS pins); a whole GPU is all of it.
    fraction = min(1.0, int(share["memory_bytes"]) / claimed.gpus[0].memory_bytes) if share else 1.0
    threads = cpu_threads_per_rank(
        cores=len(os.sched_getaffinity(0)),
        host_gpus=max(worker_state.HOST_GPUS, len(claimed.gpus)),
        gpu_fraction=fraction,
    )
    env = {"OMP_NUM_THREADS": str(threads)}
    if share is not None:
        env.update(_share_env(share, fraction))
    elif claimed.qos is not None:
        env.update(_qos_env(claimed, claimed.qos))
    return env


def attempt_env(
    claimed: Claimed,
    *,
    attempt_id: int,
    token: int,
    checkpoint_dir: Path,
    compile_dir: Path,
    lease_file: Path,
    local_dir: Path | None = None,
    final_retry_s: float | None = None,
    team_cache_dir: Path | None = None,
    shared_cache_dir: Path | None = None,
    ckpt_writers: int | None = None,
) -> dict[str, str]:
    # Built from nothing: the worker's own environment (its KILN_* settings, database and broker URLs that may hold
    # passwords, whatever its service manager set) is not the attempt's.
    env = _from_host()
    env.update(
        {
            ENV_FENCING_TOKEN: str(token),
            ENV_CHECKPOINT_DIR: str(checkpoint_dir),
            ENV_COMPILE_CACHE_DIR: str(compile_dir),
            ENV_LEASE_FILE: str(lease_file),
            ENV_JOB_ID: str(claimed.job_id),
            ENV_ATTEMPT_ID: str(attempt_id),
            "PYTHONUNBUFFERED": "1",  # the log streams live to `kiln logs -f`
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in claimed.gpus),  # empty: a CPU job sees no GPU
            "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP multicast is not shared safely between tenants
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a failed peer raises (-> ExitCode.NCCL_ERROR), never hangs
        }
    )
    if local_dir is not None:
        env[ENV_LOCAL_CHECKPOINT_DIR] = str(local_dir)
    if team_cache_dir is not None:  # the team's compile cache: every job and host of the team reuses its entries
        env[ENV_TEAM_COMPILE_CACHE_DIR] = str(team_cache_dir)
    if shared_cache_dir is not None:
        env[ENV_SHARED_COMPILE_CACHE_DIR] = str(shared_cache_dir)
    if final_retry_s is not None:  # the worker's setting; the ranks default to the same value without it
        env[ENV_FINAL_CHECKPOINT_RETRY_S] = f"{final_retry_s:g}"
    if ckpt_writers is not None:  # the worker's setting; without it each rank picks min(8, its cores)
        env[ENV_CKPT_WRITERS] = str(ckpt_writers)
    if claimed.gpus:
        env.update(_gpu_env(claimed))
    else:
        # A CPU slot is one core: without this every rank starts a thread per core and they all fight.
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def local_tier_dir(settings: Settings, claimed: Claimed) -> Path | None:
    """The job's own directory in this host's fast local tier, when its spec asks for the tier and the host has
    one: the worker names it (the spec names no path), the same for every attempt of the job on this host. The
    tier is the host's, shared by every kiln database on it, so each keeps its jobs under its own uid: another
    database's job of the same number (a recreated database, a second kiln) never resumes from this one's."""
    wanted = bool(((claimed.spec or {}).get("checkpointing") or {}).get("local_tier"))
    if not wanted or settings.local_tier_dir is None:
        return None
    return local_tier_jobs(settings.local_tier_dir, claimed.deployment) / str(claimed.job_id)
