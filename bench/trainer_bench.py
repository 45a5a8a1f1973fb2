"""Bare compiled loop vs kiln's trainer on the same GPT, in one run (issue 3, acceptance 6).

    python bench/trainer_bench.py                 # H200: GPT-2 124M, batch 32 x 1024, bf16
    python bench/trainer_bench.py --smoke         # CPU: tiny sizes, checks the harness end to end

Every measurement is its own process, as production runs it: the bare loop is ``--bare`` mode of this file;
kiln variants are ``python -m trainer --spec ... --run-dir ...`` with their throughput read back from the
trainer's own telemetry (step records' timestamps after warm-up).  Variants:

* ``bare``              hand-written loop: regional compile, bf16 autocast, fused AdamW, clip, synthetic tokens
* ``kiln``              the trainer with telemetry and the loss-spike guard on, no periodic checkpoint
* ``kiln_ckpt100``      plus an async checkpoint every 100 steps
* ``kiln_ckpt10``       plus an async checkpoint every 10 steps
* ``compile_cold/warm`` compile time with an empty compile cache, then from the cache the cold run saved
                        (each with a fresh Inductor cache dir, so the kiln cache is the only warm source)

Targets (issue 3): kiln/bare >= 0.97; ckpt100 >= 0.95; ckpt10 >= 0.85; warm <= 20% of cold;
predicted peak memory within 10% of measured.  Results are written as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The children import trainer/ and core/ from this checkout, and whatever else the caller's path provides.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
PYPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def sizes(smoke: bool) -> dict[str, Any]:
    if smoke:
        return {"size": "tiny", "corpus": "synthetic", "batch_size": 4, "seq_len": 64, "n_layer": 1}
    return {"size": "gpt2", "corpus": "synthetic", "batch_size": 32, "seq_len": 1024}


def spec(hp: dict[str, Any], *, steps: int, every: int | None, compile_mode: str, precision: str,
         timeout: float) -> dict[str, Any]:
    return {
        "name": "bench", "team": "bench", "steps": steps, "seed": 0, "parallelism": "ddp",
        "recipe": {"name": "gpt", "hyperparameters": {**hp, "lr": 6e-4, "log_every": 1, "heartbeat_s": 5.0}},
        "compile": {"mode": compile_mode, "timeout_s": timeout}, "precision": precision,
        "checkpointing": {"every_steps": every, "keep_last": 2, "asynchronous": True},
    }


def read_records(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    path = run_dir / "telemetry" / "rank0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_kiln(name: str, spec_d: dict[str, Any], work: pathlib.Path, warmup: int, items_per_step: int,
             env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec_d))
    env = {**os.environ, "PYTHONPATH": PYPATH, **(env_extra or {})}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(run_dir / "spec.json"),
                           "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: trainer exited {proc.returncode}\n{proc.stderr[-4000:]}")
    recs = read_records(run_dir)
    steps = [r for r in recs if r["kind"] == "step"]
    done = next(r for r in recs if r["kind"] == "done")
    events = [r for r in recs if r["kind"] == "event"]
    compile_ev = next((e for e in events if e["type"].startswith(("COMPILE_OK", "FALLBACK_"))), None)
    window = [s for s in steps if s["step"] > warmup]
    out: dict[str, Any] = {"wall_s": wall, "steps": len(steps), "final_loss": done["final_loss"],
                           "predicted_peak_bytes": done["predicted_peak_bytes"],
                           "measured_peak_bytes": done["measured_peak_bytes"],
                           "memory_prediction_error": done["memory_prediction_error"],
                           "checkpoints": done["checkpoints"],
                           "compile": compile_ev["fields"] if compile_ev else None,
                           "compile_event": compile_ev["type"] if compile_ev else None}
    if len(window) >= 2:
        span = window[-1]["ts"] - window[0]["ts"]
        out["tokens_per_s"] = items_per_step * (len(window) - 1) / span
        out["measured_steps"] = len(window) - 1
    return out


def bare(args: argparse.Namespace) -> None:
    """The baseline: what a careful engineer writes by hand, nothing else."""
    import torch

    from trainer.recipes.gpt import GPTRecipe, gpt_loss

    hp = sizes(args.smoke)
    recipe = GPTRecipe(hp)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    if args.compile != "off":
        for block in recipe.blocks(model):
            block.compile(fullgraph=True, dynamic=False)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    b, t, v = recipe.batch_size, recipe.cfg.seq_len, recipe.cfg.vocab_size

    def step() -> torch.Tensor:
        x = torch.randint(0, v, (b, t), device=device)
        y = torch.randint(0, v, (b, t), device=device)
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            loss = gpt_loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        last = step()
    last.item()
    dt = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": b * t * args.steps / dt, "measured_steps": args.steps,
                      "loss": float(last.item())}))


def run_bare(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--bare", "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--compile", args.compile] + (["--smoke"] if args.smoke else [])
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": PYPATH}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bare loop failed:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny CPU-sized run to check the harness")
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=None, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--compile", default=None, choices=["regional", "whole", "off"])
    ap.add_argument("--variants", default="bare,kiln,kiln_ckpt100,kiln_ckpt10,compile_cache")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "trainer_bench.json")
    ap.add_argument("--workdir", type=pathlib.Path, default=None)
    args = ap.parse_args()
    args.steps = args.steps or (30 if args.smoke else 100)
    args.warmup = args.warmup or (5 if args.smoke else 10)
    args.compile = args.compile or ("off" if args.smoke else "regional")
    if args.bare:
        bare(args)
        return

    import torch

    hp = sizes(args.smoke)
    from trainer.recipes.gpt import GPTRecipe

    recipe = GPTRecipe(hp)
    items = recipe.batch_size * recipe.cfg.seq_len
    cuda = torch.cuda.is_available()
    precision = "bf16" if cuda else "fp32"
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in gpu), None)
    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    variants = set(args.variants.split(","))
    total = args.warmup + args.steps
    res: dict[str, Any] = {"device": gpu, "torch": torch.__version__, "smoke": args.smoke, "config": hp,
                           "precision": precision, "compile": args.compile, "steps": args.steps,
                           "warmup": args.warmup, "flops_per_token": recipe.flops_per_item(),
                           "peak_flops": peak, "variants": {}}

    def mfu(tps: float | None) -> float | None:
        return tps * recipe.flops_per_item() / peak if tps and peak else None

    def record(name: str, r: dict[str, Any]) -> None:
        r["mfu"] = mfu(r.get("tokens_per_s"))
        res["variants"][name] = r
        print(f"{name:14s} tokens/s={r.get('tokens_per_s') or 0:12.0f} mfu={r['mfu'] or 0:.3f}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))

    if "bare" in variants:
        record("bare", run_bare(args))
    kiln_runs = {"kiln": (total, None), "kiln_ckpt100": (args.warmup + max(args.steps, 200), 100),
                 "kiln_ckpt10": (total, 10)}
    for name, (steps, every) in kiln_runs.items():
        if name in variants:
            s = spec(hp, steps=steps, every=every, compile_mode=args.compile, precision=precision, timeout=600)
            record(name, run_kiln(name, s, work, args.warmup, items))
    if "compile_cache" in variants:
        cache = work / "compile-cache"
        shutil.rmtree(cache, ignore_errors=True)
        for name in ("compile_cold", "compile_warm"):
            s = spec(hp, steps=3, every=None, compile_mode="regional", precision=precision, timeout=600)
            env = {"KILN_COMPILE_CACHE_DIR": str(cache),
                   "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-", dir=work),
                   "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-", dir=work)}
            record(name, run_kiln(name, s, work, 0, items, env))

    v = res["variants"]

    def ratio(a: str, b: str) -> float | None:
        x, y = v.get(a, {}).get("tokens_per_s"), v.get(b, {}).get("tokens_per_s")
        return x / y if x and y else None

    cold = (v.get("compile_cold", {}).get("compile") or {}).get("elapsed_s")
    warm = (v.get("compile_warm", {}).get("compile") or {}).get("elapsed_s")
    mem = v.get("kiln", {})
    res["summary"] = {
        "ratio_kiln_vs_bare": ratio("kiln", "bare"),
        "ratio_ckpt100_vs_bare": ratio("kiln_ckpt100", "bare"),
        "ratio_ckpt10_vs_bare": ratio("kiln_ckpt10", "bare"),
        "compile_cold_s": cold, "compile_warm_s": warm,
        "warm_over_cold": warm / cold if warm and cold else None,
        "warm_cache_hit": (v.get("compile_warm", {}).get("compile") or {}).get("cache_hit"),
        "predicted_peak_bytes": mem.get("predicted_peak_bytes"),
        "measured_peak_bytes": mem.get("measured_peak_bytes"),
        "memory_prediction_error": mem.get("memory_prediction_error"),
    }
    targets = {"ratio_kiln_vs_bare": (">=", 0.97), "ratio_ckpt100_vs_bare": (">=", 0.95),
               "ratio_ckpt10_vs_bare": (">=", 0.85), "warm_over_cold": ("<=", 0.20)}
    verdict = {}
    for k, (op, t) in targets.items():
        val = res["summary"][k]
        verdict[k] = None if val is None else (val >= t if op == ">=" else val <= t)
    err = res["summary"]["memory_prediction_error"]
    verdict["memory_within_10pct"] = None if err is None else abs(err) <= 0.10
    res["targets_met"] = verdict
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res["summary"], indent=1))
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
