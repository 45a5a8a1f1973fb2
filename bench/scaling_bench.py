"""Several GPUs of one host: kiln's trainer on 1 and N GPUs (DDP, FSDP2), and what the bandwidth throttle does.

    python bench/scaling_bench.py              # every visible GPU (>= 2): GPT-2 124M, 32 x 1024 per GPU, bf16
    python bench/scaling_bench.py --smoke      # CPU: 2 gloo processes, tiny sizes; checks the harness end to end

Every measurement is its own process tree, launched as a worker launches an attempt
(``torchrun --standalone --nproc-per-node N -m trainer``), its figures read back from rank 0's telemetry.
Variants, in one run so that the ratios compare like with like:

* ``allreduce``   NCCL all-reduce of a 256 MiB bf16 buffer across the N GPUs: bus bandwidth at NCCL's own
                  channel count and at each cap in ``--channels``. A bandwidth quota reaches a job as such a cap
                  (``NCCL_MAX_NCHANNELS``, workers/attempt_env.py), so this is how a quota maps to bandwidth here.
* ``kiln_1``      one GPU: the baseline
* ``kiln_ddp``    N GPUs, DDP, the same batch per GPU
* ``kiln_fsdp``   N GPUs, FSDP2 (``fully_shard``)
* ``kiln_ddp_capped``  N GPUs, DDP, with the smallest channel cap of ``--channels``: the throttle on a job

Figures: global tokens/s; scaling efficiency = tokens/s(N) / (N x tokens/s(1)); MFU per GPU; NVLink transmit
and receive bytes/s of rank 0's GPU from the trainer's NVML samples (null where NVML has no NVLink counters);
the trainer's gradient-sync probe latency; predicted vs measured peak memory of rank 0. JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from trainer_bench import PEAK_BF16, PYPATH, ROOT, read_records, run_kiln, sizes, spec  # noqa: E402

# NVLink multicast (NVLS) stays off: it is not shared safely between tenants, and the worker turns it off too.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def allreduce_worker(mib: int, iters: int) -> None:
    """One rank of the all-reduce measurement (under torchrun); rank 0 prints a JSON line."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda" if cuda else "cpu")
    dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": device} if cuda else {}))
    x = torch.ones(mib * 2**20 // 2, dtype=torch.bfloat16, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(5):
        dist.all_reduce(x)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    dt = (time.perf_counter() - t0) / iters
    nbytes = x.numel() * x.element_size()
    if rank == 0:
        # nccl-tests' convention: bus bandwidth = algorithm bandwidth x 2(n-1)/n for an all-reduce.
        print(
            json.dumps(
                {
                    "bytes": nbytes,
                    "seconds": dt,
                    "algbw_gb_s": nbytes / dt / 1e9,
                    "busbw_gb_s": nbytes / dt / 1e9 * 2 * (world - 1) / world,
                }
            )
        )
    dist.destroy_process_group()


def run_allreduce(nproc: int, channels: int | None, mib: int, iters: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": PYPATH, **SAFE_ENV}
    if channels is not None:
        env["NCCL_MAX_NCHANNELS"] = str(channels)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        __file__,
        "--allreduce-worker",
        "--mib",
        str(mib),
        "--iters",
        str(iters),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"all-reduce with channels={channels} failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{"))
    return {"channels": channels, **json.loads(line)}


def links_and_sync(run_dir: pathlib.Path, warmup: int) -> dict[str, Any]:
    """Rank 0's NVML link samples and gradient-sync probes taken after the warm-up steps."""
    recs = read_records(run_dir)
    steps = [r for r in recs if r["kind"] == "step" and r["step"] > warmup]
    start = steps[0]["ts"] if steps else float("inf")
    samples = [r for r in recs if r["kind"] == "gpu_sample" and r["ts"] >= start]
    probes = [
        r["grad_sync_latency_s"]
        for r in recs
        if r["kind"] == "heartbeat" and r["ts"] >= start and r.get("grad_sync_latency_s") is not None
    ]

    def mean(key: str) -> float | None:
        vals = [s[key] for s in samples if s.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    return {
        "gpu_samples": len(samples),
        "nvlink_present": any(s.get("nvlink_present") for s in samples),
        "nvlink_tx_bytes_per_s": mean("nvlink_tx_bytes_per_s"),
        "nvlink_rx_bytes_per_s": mean("nvlink_rx_bytes_per_s"),
        "util_gpu": mean("util_gpu"),
        "grad_sync_latency_s": statistics.median(probes) if probes else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, 2 gloo processes, tiny sizes")
    ap.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mib", type=int, default=None, help="all-reduce buffer size")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--nproc", type=int, default=None, help="GPUs to scale to (default: all visible)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per trainer variant")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--channels", default="16,8,4,2,1", help="NCCL channel caps to measure")
    ap.add_argument("--variants", default="allreduce,kiln_1,kiln_ddp,kiln_fsdp,kiln_ddp_capped")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "scaling_bench.json")
    args = ap.parse_args()
    args.mib = args.mib or (8 if args.smoke else 256)
    args.iters = args.iters or (5 if args.smoke else 20)
    if args.allreduce_worker:
        allreduce_worker(args.mib, args.iters)
        return

    import torch

    cuda = torch.cuda.is_available()
    nproc = args.nproc or (torch.cuda.device_count() if cuda else 2)
    if nproc < 2:
        sys.exit("scaling_bench needs at least 2 GPUs (or --smoke on CPU)")
    args.steps = args.steps or (6 if args.smoke else 100)
    args.warmup = args.warmup or (3 if args.smoke else 20)
    caps = [int(c) for c in args.channels.split(",") if c]
    variants = args.variants.split(",")

    hp = {**sizes(args.smoke), "gpu_sample_s": 0.5, "probe_every_steps": 10}
    from trainer.recipes.gpt import GPTRecipe

    recipe = GPTRecipe(hp)
    per_gpu = recipe.batch_size * recipe.cfg.seq_len
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in gpu), None)
    precision = "bf16" if cuda else "fp32"
    work = pathlib.Path(tempfile.mkdtemp(prefix="kiln-scaling-"))
    res: dict[str, Any] = {
        "device": gpu,
        "gpus": nproc,
        "torch": torch.__version__,
        "smoke": args.smoke,
        "config": hp,
        "precision": precision,
        "steps": args.steps,
        "warmup": args.warmup,
        "tokens_per_step_per_gpu": per_gpu,
        "peak_flops_per_gpu": peak,
        "variants": {},
    }

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))

    if "allreduce" in variants:
        res["allreduce"] = []
        for cap in [None, *caps]:
            try:
                r = run_allreduce(nproc, cap, args.mib, args.iters)
            except RuntimeError as exc:
                r = {"channels": cap, "error": str(exc)[-3000:]}
            res["allreduce"].append(r)
            print(
                f"all-reduce {args.mib} MiB channels={cap or 'default':>7} busbw={r.get('busbw_gb_s', 0):8.1f} GB/s",
                flush=True,
            )
            save()

    # Smoke runs stay eager (a CPU compile costs minutes on a shared 2-core box); on GPUs the trainer's default.
    mode = "off" if args.smoke else None
    shared = {"KILN_COMPILE_CACHE_DIR": str(work / "compile-cache"), **SAFE_ENV}
    runs: dict[str, tuple[int, str, dict[str, str]]] = {
        "kiln_1": (1, "ddp", {}),
        "kiln_ddp": (nproc, "ddp", {}),
        "kiln_fsdp": (nproc, "fsdp", {}),
        "kiln_ddp_capped": (nproc, "ddp", {"NCCL_MAX_NCHANNELS": str(min(caps, default=2))}),
    }
    for name in [v for v in variants if v in runs]:
        n, parallelism, env_extra = runs[name]
        s = {
            **spec(hp, steps=args.warmup + args.steps, every=None, compile_mode=mode, precision=precision, timeout=600),
            "parallelism": parallelism,
        }
        s["recipe"]["hyperparameters"]["heartbeat_s"] = 0.5  # a gradient-sync probe reading every half second
        try:
            r = run_kiln(name, s, work, args.warmup, per_gpu * n, {**shared, **env_extra}, nproc=n)
        except RuntimeError as exc:  # one failed variant must not cost the others (one device run)
            print(f"{name} FAILED: {exc}", flush=True)
            res["variants"][name] = {"error": str(exc)[-4000:]}
            save()
            continue
        r.update(gpus=n, parallelism=parallelism, env=env_extra, **links_and_sync(work / name, args.warmup))
        tps = r.get("tokens_per_s")
        r["mfu_per_gpu"] = tps * recipe.flops_per_item() / (peak * n) if tps and peak else None
        base = res["variants"].get("kiln_1", {}).get("tokens_per_s")
        r["scaling_efficiency"] = tps / (n * base) if tps and base and n > 1 else None
        res["variants"][name] = r
        nvl = r["nvlink_tx_bytes_per_s"]
        print(
            f"{name:16s} gpus={n} tokens/s={tps or 0:10.0f} efficiency={r['scaling_efficiency'] or 0:.3f} "
            f"nvlink_tx={'-' if nvl is None else f'{nvl / 1e9:.1f} GB/s'} "
            f"sync={r['grad_sync_latency_s'] or 0:.4f}s mem_err={r['memory_prediction_error'] or 0:+.3f}",
            flush=True,
        )
        save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
