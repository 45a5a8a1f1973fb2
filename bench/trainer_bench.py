"""Bare compiled loop vs kiln's trainer on the same GPT, in one run: what kiln's guarantees cost per step.

    python bench/trainer_bench.py                 # H200: GPT-2 124M, batch 32 x 1024, bf16
    python bench/trainer_bench.py --smoke         # CPU: tiny sizes, checks the harness end to end

Every measurement is its own process, as production runs it: the bare loop is ``--bare`` mode of this file;
kiln variants are ``python -m trainer --spec ... --run-dir ...`` with their throughput read back from the
trainer's own telemetry (step records' timestamps after warm-up).  Variants:

* ``disk``              the write bandwidth (with fsync) of the checkpoint directory's disk and of /dev/shm,
                        1 thread and the checkpoint writer's thread count: the physical bound of the writer
* ``bare``              hand-written loop as the project's anchor: whole-model compile (model + loss in one
                        graph), bf16 autocast, fused AdamW, clip, synthetic tokens
* ``bare_regional``     the same loop, regional compile (each block, and the LM head + loss)
* ``kiln``              the trainer with telemetry and the loss-spike guard on, no periodic checkpoint, its
                        default compile mode (whole on GPU)
* ``kiln_regional``     the same, regional compile
* ``kiln_ckpt100``      plus an async checkpoint every 100 steps (checkpoint dir on the work dir's disk)
* ``kiln_ckpt10``       plus an async checkpoint every 10 steps, durable tier only (same disk): the honest
                        disk figure, bound by the disk's bandwidth
* ``kiln_ckpt10_tiered`` every 10 steps committed (atomic, sha256 manifest, fence) to the local tier
                        (``local_tier``: a dir in /dev/shm, as a worker names it), every 10th of them (= every 100
                        steps) copied in the background to the durable job dir on disk (``persist_every`` 10):
                        the answer to the ">= 0.85 every 10 steps" target (see docs/trainer.md)
* ``kiln_ckpt10_shm``   every 10 steps with the whole checkpoint dir in /dev/shm (not durable; kept as an option)
* ``compile_{cold,warm}[_regional]`` compile time with an empty compile-cache dir, then, in a fresh process
                        (as a restarted attempt), from what the cold run left there (kiln's artifacts and the
                        Inductor/Triton caches it keeps in that dir)

Targets: kiln/bare >= 0.97; ckpt100 >= 0.95; ckpt10 >= 0.85 (answered by the tiered variant; the
durable-only figure is reported beside it); warm <= 20% of cold;
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


def spec(
    hp: dict[str, Any],
    *,
    steps: int,
    every: int | None,
    compile_mode: str | None,
    precision: str,
    timeout: float,
    ckpt: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``compile_mode`` None leaves the mode out of the spec: the trainer picks its default."""
    compile_opts: dict[str, Any] = {"timeout_s": timeout, **({"mode": compile_mode} if compile_mode else {})}
    return {
        "name": "bench",
        "team": "bench",
        "steps": steps,
        "seed": 0,
        "parallelism": "ddp",
        "recipe": {"name": "gpt", "hyperparameters": {**hp, "lr": 6e-4, "log_every": 1, "heartbeat_s": 5.0}},
        "compile": compile_opts,
        "precision": precision,
        "checkpointing": {"every_steps": every, "keep_last": 2, "asynchronous": True, **(ckpt or {})},
    }


def read_records(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    path = run_dir / "telemetry" / "rank0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_kiln(
    name: str,
    spec_d: dict[str, Any],
    work: pathlib.Path,
    warmup: int,
    items_per_step: int,
    env_extra: dict[str, str] | None = None,
    nproc: int = 0,
) -> dict[str, Any]:
    """``nproc`` 0: ``python -m trainer`` alone; else under ``torchrun --standalone`` with that many ranks,
    as a worker starts it (``items_per_step`` is then the global batch)."""
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec_d))
    env = {**os.environ, "PYTHONPATH": PYPATH, **(env_extra or {})}
    for key in [k for k, val in env.items() if val == "" and k in (env_extra or {})]:
        del env[key]  # an empty value in env_extra means: unset it for this run
    t0 = time.perf_counter()
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc else []
    proc = subprocess.run(
        [sys.executable, *launcher, "-m", "trainer", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: trainer exited {proc.returncode}\n{proc.stderr[-4000:]}")
    recs = read_records(run_dir)
    steps = [r for r in recs if r["kind"] == "step"]
    done = next(r for r in recs if r["kind"] == "done")
    events = [r for r in recs if r["kind"] == "event"]
    ckpts = [r for r in recs if r["kind"] == "checkpoint"]
    local = [e["fields"] for e in events if e["type"] == "CHECKPOINT_LOCAL"]
    staging = next((r["fields"] for r in recs if r["kind"] == "diagnostic" and r["type"] == "CHECKPOINT_STAGING"), None)
    exit_ev = [e for e in events if e["type"] == "EXIT"]
    compile_ev = next((e for e in events if e["type"].startswith(("COMPILE_OK", "FALLBACK_"))), None)
    window = [s for s in steps if s["step"] > warmup]
    out: dict[str, Any] = {
        "wall_s": wall,
        "steps": len(steps),
        "final_loss": done["final_loss"],
        "predicted_peak_bytes": done["predicted_peak_bytes"],
        "measured_peak_bytes": done["measured_peak_bytes"],
        "memory_prediction_error": done["memory_prediction_error"],
        "checkpoints": done["checkpoints"],
        "compile": compile_ev["fields"] if compile_ev else None,
        "compile_event": compile_ev["type"] if compile_ev else None,
        "memory_breakdown": next((r for r in recs if r["kind"] == "memory_prediction"), {}).get("breakdown"),
        "staging": staging,
        "last_record_exit_code": exit_ev[-1]["fields"]["exit_code"] if exit_ev else None,
    }
    # Saves the loop made: local-tier commits when tiered, else the durable checkpoint records.
    saves = local or ckpts
    if saves:
        stalls = [c.get("stall_s") or 0.0 for c in saves]
        writes = [c.get("write_s") or 0.0 for c in saves]
        out["checkpoint_bytes"] = saves[-1]["bytes"]
        out["checkpoint_format"] = saves[-1].get("format")
        out["checkpoint_tier"] = saves[-1].get("tier")
        out["checkpoint_saves"] = len(saves)
        out["checkpoint_stall_s"] = {"mean": sum(stalls) / len(stalls), "max": max(stalls)}
        out["checkpoint_write_s"] = {"mean": sum(writes) / len(writes), "max": max(writes)}
    if local:
        persists = [c.get("persist_s") or 0.0 for c in ckpts]
        out["durable_checkpoints"] = [
            {"step": c["step"], "tier": c.get("tier"), "persist_s": c.get("persist_s")} for c in ckpts
        ]
        if persists:
            out["persist_s"] = {"mean": sum(persists) / len(persists), "max": max(persists)}
        out["checkpoints_persisted"] = done.get("checkpoints_persisted")
        out["checkpoint_failures"] = done.get("checkpoint_failures")
        out["superseded_persists"] = sum(e["type"] == "CHECKPOINT_PERSIST_SUPERSEDED" for e in events)
    if len(window) >= 2:
        span = window[-1]["ts"] - window[0]["ts"]
        out["tokens_per_s"] = items_per_step * (len(window) - 1) / span
        out["measured_steps"] = len(window) - 1
    return out


def bare(args: argparse.Namespace) -> None:
    """The baseline: what a careful engineer writes by hand, nothing else."""
    import torch
    from bare_loop import adamw, gpt_batches, timed_steps, train_step

    from trainer.recipes.gpt import GPTRecipe, gpt_loss

    hp = model_hyperparameters(args)
    graphs = args.cuda_graphs and torch.cuda.is_available()
    recipe = GPTRecipe(hp)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    kwargs: dict[str, Any] = {"fullgraph": True, "dynamic": False, **({"mode": "reduce-overhead"} if graphs else {})}
    if args.compile == "whole":  # model and loss in one graph (GPT.forward computes the loss given targets)
        model.compile(**kwargs)
    elif args.compile == "regional":
        for region in recipe.compile_regions(model):
            region.compile(**kwargs)
    opt = adamw(model, fused=True)
    draw = gpt_batches(recipe, device)  # the job's own data

    def loss() -> torch.Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return gpt_loss(model, *draw())

    step = train_step(model, opt, loss, device)
    items = recipe.batch_size * recipe.cfg.seq_len
    timed_steps(step, warmup=args.warmup, steps=args.steps, items_per_step=items, device=device)


def model_hyperparameters(args: argparse.Namespace) -> dict[str, Any]:
    """The bench's model and batch: its own sizes, or a job spec's (``--hp-from-spec``, e.g. a shipped example)."""
    if args.hp_from_spec is None:
        return sizes(args.smoke)
    from core.spec import parse_spec_text

    parsed = parse_spec_text(args.hp_from_spec.read_text()).recipe
    assert parsed is not None and parsed.name == "gpt", "--hp-from-spec takes a spec of the gpt recipe"
    return dict(parsed.hyperparameters)


def run_bare(args: argparse.Namespace, mode: str, cuda_graphs: bool = False) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--bare",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--compile",
        mode,
    ] + (["--smoke"] if args.smoke else [])
    cmd += ["--hp-from-spec", str(args.hp_from_spec)] if args.hp_from_spec else []
    cmd += ["--cuda-graphs"] if cuda_graphs else []
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": PYPATH}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bare loop failed:\n{proc.stderr[-4000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "compile": mode, "cuda_graphs": cuda_graphs}


def disk_bandwidth(directory: pathlib.Path, total: int, threads: int) -> dict[str, Any]:
    """GB/s of writing ``total`` bytes split over ``threads`` files in ``directory``, fsync included - the
    same pattern as the checkpoint writer (its chunk size, GIL released in os.write)."""
    import concurrent.futures

    directory.mkdir(parents=True, exist_ok=True)
    chunk = memoryview(os.urandom(64 << 20))
    per = total // threads

    def one(i: int) -> None:
        fd = os.open(directory / f"bw_{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = per
            while left > 0:
                left -= os.write(fd, chunk[: min(left, len(chunk))])
            os.fsync(fd)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
    dt = time.perf_counter() - t0
    for i in range(threads):
        (directory / f"bw_{i}.bin").unlink()
    return {
        "dir": str(directory),
        "bytes": per * threads,
        "threads": threads,
        "seconds": dt,
        "gb_per_s": per * threads / dt / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny CPU-sized run to check the harness")
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=None, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--compile", default=None, choices=["regional", "whole", "off"], help="(--bare mode)")
    ap.add_argument("--hp-from-spec", type=pathlib.Path, default=None, help="a job spec's model and batch (gpt)")
    ap.add_argument("--cuda-graphs", action="store_true", help="(--bare mode) compile with CUDA graphs")
    ap.add_argument(
        "--variants",
        default="disk,bare,kiln,kiln_ckpt100,kiln_ckpt10,kiln_ckpt10_tiered,compile_cache",
        help="also: bare_regional, kiln_regional, kiln_ckpt10_shm, compile_cache_regional, bare_graphs, kiln_graphs",
    )
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "trainer_bench.json")
    ap.add_argument("--workdir", type=pathlib.Path, default=None)
    args = ap.parse_args()
    args.steps = args.steps or (30 if args.smoke else 100)
    args.warmup = args.warmup or (5 if args.smoke else 10)
    args.compile = args.compile or "whole"
    if args.bare:
        bare(args)
        return

    import torch

    hp = model_hyperparameters(args)
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
    # Smoke runs stay eager (CPU compile of even the tiny model costs minutes on a shared 2-core box).
    mode_whole, mode_regional = ("off", "off") if args.smoke else ("whole", "regional")
    res: dict[str, Any] = {
        "device": gpu,
        "torch": torch.__version__,
        "smoke": args.smoke,
        "config": hp,
        "precision": precision,
        "steps": args.steps,
        "warmup": args.warmup,
        "flops_per_token": recipe.flops_per_item(),
        "peak_flops": peak,
        "variants": {},
    }

    def mfu(tps: float | None) -> float | None:
        return tps * recipe.flops_per_item() / peak if tps and peak else None

    def record(name: str, r: dict[str, Any]) -> None:
        r["mfu"] = mfu(r.get("tokens_per_s"))
        res["variants"][name] = r
        print(f"{name:24s} tokens/s={r.get('tokens_per_s') or 0:12.0f} mfu={r['mfu'] or 0:.3f}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))

    if "disk" in variants:
        from trainer.checkpoint import writer_count

        size = (64 << 20) if args.smoke else (2 << 30)
        res["disk"] = [
            disk_bandwidth(d, size, n)
            for d in (work / "bw", pathlib.Path("/dev/shm/kiln-bw"))
            for n in (1, writer_count())
            if d.parent.is_dir()
        ]
        print(json.dumps(res["disk"]), flush=True)
    if "bare" in variants:
        record("bare", run_bare(args, mode_whole))
    # The throughput variants share one compile-cache dir (as a job's attempts do), so only the first of
    # each mode compiles cold; the compile_cache variants below use their own empty dirs.
    shared = {"KILN_COMPILE_CACHE_DIR": str(work / "shared-compile-cache")}
    default_mode = None if not args.smoke else "off"
    long = args.warmup + max(args.steps, 200)  # two checkpoints of every 100 steps inside the window
    shm = pathlib.Path("/dev/shm")
    tiered = {"local_tier": True, "persist_every": 10}
    local_tier = {"KILN_LOCAL_CHECKPOINT_DIR": str(shm / "kiln-bench-local")}  # the job's dir a worker would name
    kiln_runs: dict[str, tuple[int, int | None, str | None, dict[str, str], dict[str, Any]]] = {
        "kiln": (total, None, default_mode, {}, {}),
        "kiln_graphs": (total, None, default_mode, {}, {}),
        "kiln_ckpt10": (total, 10, default_mode, {}, {}),
        "kiln_ckpt100": (long, 100, default_mode, {}, {}),
        # Same length as ckpt100: its durable copies (every 100 steps) fall inside the measured window.
        "kiln_ckpt10_tiered": (long, 10, default_mode, local_tier, tiered),
        "bare_regional": (0, None, None, {}, {}),
        "bare_graphs": (0, None, None, {}, {}),
        "kiln_regional": (total, None, mode_regional, {}, {}),
        "kiln_ckpt10_shm": (total, 10, default_mode, {"KILN_CHECKPOINT_DIR": "/dev/shm/kiln-bench-ckpt"}, {}),
    }
    order = [x for x in args.variants.split(",") if x in kiln_runs or x.startswith("compile_cache")]
    for name in order:
        if name == "bare_regional":
            record(name, run_bare(args, mode_regional))
            continue
        if name == "bare_graphs":
            record(name, run_bare(args, mode_whole, cuda_graphs=True))
            continue
        if name in kiln_runs:
            steps, every, mode, env_extra, ckpt = kiln_runs[name]
            scratch = [
                pathlib.Path(p)
                for p in (env_extra.get("KILN_CHECKPOINT_DIR"), env_extra.get("KILN_LOCAL_CHECKPOINT_DIR"))
                if p
            ]
            if scratch and not shm.is_dir():
                continue
            for p in scratch:
                shutil.rmtree(p, ignore_errors=True)
            s = spec(hp, steps=steps, every=every, compile_mode=mode, precision=precision, timeout=600, ckpt=ckpt)
            if name.endswith("_graphs") and mode != "off":  # a smoke run is eager: graphs need a compile
                s["compile"]["cuda_graphs"] = True
            try:
                r = run_kiln(name, s, work, args.warmup, items, {**shared, **env_extra})
            except RuntimeError as exc:  # one failed variant must not cost the others (one device run)
                print(f"{name} FAILED: {exc}", flush=True)
                res["variants"][name] = {"error": str(exc)[-4000:]}
                continue
            if ckpt:
                # What a host loss would leave: the durable dir alone.  Every checkpoint there must verify.
                from trainer.checkpoint import list_checkpoints, verify

                r["durable_dir_verified"] = {
                    str(st): verify(p) is None for st, p in list_checkpoints(work / name / "checkpoints")
                }
            record(name, r)
            for p in scratch:
                shutil.rmtree(p, ignore_errors=True)
            continue
        suffix, mode = ("_regional", mode_regional) if name.endswith("_regional") else ("", default_mode)
        cache = work / f"compile-cache{suffix}"
        shutil.rmtree(cache, ignore_errors=True)
        for phase in ("compile_cold", "compile_warm"):
            s = spec(hp, steps=3, every=None, compile_mode=mode, precision=precision, timeout=600)
            # Only the kiln compile-cache dir carries state between the two processes: the trainer keeps
            # the Inductor/Triton caches inside it (unless these variables are set, so unset them here).
            env = {"KILN_COMPILE_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": "", "TRITON_CACHE_DIR": ""}
            record(phase + suffix, run_kiln(phase + suffix, s, work, 0, items, env))

    v = res["variants"]

    def ratio(a: str, b: str) -> float | None:
        x, y = v.get(a, {}).get("tokens_per_s"), v.get(b, {}).get("tokens_per_s")
        return x / y if x and y else None

    def compile_s(name: str) -> float | None:
        return (v.get(name, {}).get("compile") or {}).get("elapsed_s")

    cold, warm = compile_s("compile_cold"), compile_s("compile_warm")
    cold_r, warm_r = compile_s("compile_cold_regional"), compile_s("compile_warm_regional")
    mem = v.get("kiln", {})
    mem_r = v.get("kiln_regional", {})
    res["summary"] = {
        "bare_tokens_per_s": v.get("bare", {}).get("tokens_per_s"),
        "ratio_kiln_vs_bare": ratio("kiln", "bare"),
        "ratio_ckpt100_vs_bare": ratio("kiln_ckpt100", "bare"),
        "ratio_ckpt10_vs_bare": ratio("kiln_ckpt10", "bare"),
        "ratio_ckpt10_tiered_vs_bare": ratio("kiln_ckpt10_tiered", "bare"),
        "ratio_ckpt10_shm_vs_bare": ratio("kiln_ckpt10_shm", "bare"),
        "ratio_bare_regional_vs_bare": ratio("bare_regional", "bare"),
        "ratio_bare_graphs_vs_bare": ratio("bare_graphs", "bare"),
        "ratio_kiln_graphs_vs_bare_graphs": ratio("kiln_graphs", "bare_graphs"),
        "ratio_kiln_regional_vs_bare_regional": ratio("kiln_regional", "bare_regional"),
        "compile_cold_s": cold,
        "compile_warm_s": warm,
        "warm_over_cold": warm / cold if warm and cold else None,
        "warm_cache_hit": (v.get("compile_warm", {}).get("compile") or {}).get("cache_hit"),
        # torch's compiler modules import in the background from process start (trainer.compile_preload);
        # what the compile still had to wait for is outside its figure, so it is reported here.
        "compile_preload_wait_s": [
            ((v.get(n, {}).get("compile") or {}).get("phases") or {}).get("preload_wait_s")
            for n in ("compile_cold", "compile_warm")
        ],
        "compile_process_wall_s": [v.get(n, {}).get("wall_s") for n in ("compile_cold", "compile_warm")],
        "compile_cold_regional_s": cold_r,
        "compile_warm_regional_s": warm_r,
        "warm_over_cold_regional": warm_r / cold_r if warm_r and cold_r else None,
        "predicted_peak_bytes": mem.get("predicted_peak_bytes"),
        "measured_peak_bytes": mem.get("measured_peak_bytes"),
        "memory_prediction_error": mem.get("memory_prediction_error"),
        "memory_prediction_error_regional": mem_r.get("memory_prediction_error"),
        "disk_gb_per_s": {f"{d['dir']}x{d['threads']}": d["gb_per_s"] for d in res.get("disk", [])},
        "ckpt10_durable_stall_s_mean": (v.get("kiln_ckpt10", {}).get("checkpoint_stall_s") or {}).get("mean"),
        "ckpt10_tiered_stall_s_mean": (v.get("kiln_ckpt10_tiered", {}).get("checkpoint_stall_s") or {}).get("mean"),
        "ckpt10_tiered_local_write_s_mean": (v.get("kiln_ckpt10_tiered", {}).get("checkpoint_write_s") or {}).get(
            "mean"
        ),
        "ckpt10_tiered_persist_s_mean": (v.get("kiln_ckpt10_tiered", {}).get("persist_s") or {}).get("mean"),
        "ckpt10_tiered_durable_steps": [
            c["step"] for c in v.get("kiln_ckpt10_tiered", {}).get("durable_checkpoints", [])
        ],
        "ckpt10_tiered_durable_dir_verified": v.get("kiln_ckpt10_tiered", {}).get("durable_dir_verified"),
    }
    # "every 10 steps >= 0.85" is answered by the tiered run (a verified checkpoint every 10 steps, a durable
    # one every 100); the durable-only every-10 figure is judged too, against the same bar, and reported.
    targets = {
        "ratio_kiln_vs_bare": (">=", 0.97),
        "ratio_ckpt100_vs_bare": (">=", 0.95),
        "ratio_ckpt10_tiered_vs_bare": (">=", 0.85),
        "ratio_ckpt10_vs_bare": (">=", 0.85),
        "warm_over_cold": ("<=", 0.20),
    }
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
