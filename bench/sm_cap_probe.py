"""Where do the NaN losses of a share capped at 30% SM come from? (issue 15; README, "GPU sharing on one H200")

    python3 bench/sm_cap_probe.py              # the H200 host, as root: its own MPS daemon, every variant
    python3 bench/sm_cap_probe.py --smoke      # CPU: no MPS, a tiny model, checks the harness

Through kiln, a best-effort job with ``gpu_share: {memory_gb: 24, sm_percent: 30}`` (GPT-2 124M, bf16, whole-model
compile) had a non-finite loss at step 2, 4 and every step from 6 on (H200 run 5; runs 3 and 4 ended alike); gold
shares at 100% SM trained normally. Each variant here is its own process, an MPS client of a daemon this script
starts, training the same model on the same corpus for ``--steps`` steps and reading every step's loss and grad
norm: with and without the SM cap, the memory limit, the compile, each attention kernel, and kiln's own trainer
under the same caps. The first variant that stays finite under the cap names the part to fix. JSON to ``--out``
(and to $OUT when set).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# The best-effort share of mps_bench, the job that went NaN.
HP = {"size": "gpt2", "corpus": "stdlib", "batch_size": 32, "seq_len": 1024, "lr": 0.001}
SMOKE_HP = {"size": "tiny", "corpus": "stdlib", "batch_size": 4, "seq_len": 64, "lr": 0.001}

# name: (SM percent or None for no cap, memory limit in MiB or None, child arguments); None runs kiln's trainer.
# A name ending in ``_cold`` compiles with empty inductor and Triton caches of its own; the others share the host's,
# so a kernel tuned under one SM count may be reused under another (kiln's jobs share a host's caches too). The
# first variant runs before anything has compiled.
VARIANTS: dict[str, tuple[int | None, int | None, list[str] | None]] = {
    "sm30_whole_cold": (30, None, ["--compile", "whole"]),
    "sm100_whole": (100, None, ["--compile", "whole"]),
    "sm30_eager": (30, None, ["--compile", "off"]),
    "sm30_whole": (30, None, ["--compile", "whole"]),
    "sm30_whole_mem24g": (30, 24 * 1024, ["--compile", "whole"]),
    "sm100_whole_mem24g": (100, 24 * 1024, ["--compile", "whole"]),
    "sm30_whole_sdpa_math": (30, None, ["--compile", "whole", "--sdpa", "math"]),
    "sm30_whole_sdpa_flash": (30, None, ["--compile", "whole", "--sdpa", "flash"]),
    "sm30_eager_sdpa_math": (30, None, ["--compile", "off", "--sdpa", "math"]),
    "sm30_eager_unfused_adamw": (30, None, ["--compile", "off", "--adamw", "foreach"]),
    "sm30_eager_fp32": (30, None, ["--compile", "off", "--dtype", "fp32"]),
    "sm60_eager": (60, None, ["--compile", "off"]),
    "sm30_kiln_trainer": (30, 24 * 1024, None),
}


# The second mode (``--blas``): which bf16 GEMM goes wrong under the cap, and which setting mends it. name: (extra
# environment, torch setting applied in the child before any CUDA work).
BLAS_CONFIGS: dict[str, tuple[dict[str, str], str]] = {
    "sm100_default": ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, ""),
    "default": ({}, ""),
    "no_bf16_reduced_precision_reduction": ({}, "no_reduced"),
    "cublas_workspace_0": ({"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, ""),
    "cublaslt_workspace_0": ({"CUBLASLT_WORKSPACE_SIZE": "0"}, ""),
    "both_workspaces_0": ({"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}, ""),
    "prefer_cublaslt": ({}, "cublaslt"),
    "addmm_without_lt": ({"DISABLE_ADDMM_CUDA_LT": "1"}, ""),
    "fp16": ({}, "fp16"),
}
# GPT-2 124M's linear layers (in, out, bias) over one batch of 32 x 1024 tokens.
LAYERS = [(768, 2304, True), (768, 768, True), (768, 3072, True), (3072, 768, True), (768, 50257, False)]


def apply_blas_setting(setting: str) -> None:
    """A ``BLAS_CONFIGS`` torch setting, in this process before any CUDA work (the others are environment only)."""
    import torch

    if setting == "no_reduced":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    if setting == "cublaslt":
        torch.backends.cuda.preferred_blas_library("cublaslt")


def blas_child(setting: str, tokens: int, smoke: bool) -> None:
    """Each layer's forward and backward under bf16 (fp16) autocast against fp32 (the model's own steps are
    another child: ``blas``)."""
    import torch

    apply_blas_setting(setting)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if setting == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    layers: dict[str, dict[str, Any]] = {}
    for d_in, d_out, bias in [(16, 48, True), (16, 100, False)] if smoke else LAYERS:
        linear = torch.nn.Linear(d_in, d_out, bias=bias, device=device)
        x = torch.randn(tokens, d_in, device=device, requires_grad=True)
        grad_out = torch.randn(tokens, d_out, device=device) * 0.01
        results: dict[str, Any] = {}
        grads = {}
        for mode in ("fp32", "low"):
            x.grad = None
            linear.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=mode == "low" and device.type == "cuda"):
                out = linear(x)
            out.float().backward(grad_out)
            grads[mode] = {
                "out": out.detach().float(),
                "dx": x.grad.detach().clone(),
                "dw": linear.weight.grad.detach().clone(),
            }
            if bias:
                grads[mode]["db"] = linear.bias.grad.detach().clone()
        for name, ref in grads["fp32"].items():
            got = grads["low"][name]
            results[name] = {
                "nonfinite": int((~torch.isfinite(got)).sum()),
                "rel_err": float((got - ref).norm() / ref.norm().clamp_min(1e-30)),
            }
        layers[f"{d_in}x{d_out}{'+b' if bias else ''}"] = results
        del linear, x, grad_out, grads
    print(json.dumps({"layers": layers}))


def child(args: argparse.Namespace) -> None:
    """One variant: train, read each step's loss and grad norm at once (a probe, not a benchmark)."""
    import torch
    from bare_loop import adamw, gpt_batches

    from trainer.recipes.gpt import GPTRecipe, gpt_loss

    apply_blas_setting(args.blas_setting)
    recipe = GPTRecipe(SMOKE_HP if args.smoke else HP)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    if args.compile == "whole":
        model.compile(fullgraph=True, dynamic=False)
    opt = adamw(model, fused=device.type == "cuda" and args.adamw == "fused")
    draw = gpt_batches(recipe, device)
    backends = {
        "math": [torch.nn.attention.SDPBackend.MATH],
        "flash": [torch.nn.attention.SDPBackend.FLASH_ATTENTION],
        "efficient": [torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION],
        "cudnn": [torch.nn.attention.SDPBackend.CUDNN_ATTENTION],
    }
    sdpa = torch.nn.attention.sdpa_kernel(backends[args.sdpa]) if args.sdpa != "auto" else contextlib.nullcontext()
    dtype = torch.bfloat16 if device.type == "cuda" and args.dtype == "bf16" else torch.float32
    losses: list[float] = []
    norms: list[float] = []
    props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    t0 = time.perf_counter()
    with sdpa:
        for _ in range(args.steps):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = gpt_loss(model, *draw())
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.item()))
            norms.append(float(norm.item()))
    bad = [
        i + 1 for i, (a, b) in enumerate(zip(losses, norms, strict=True)) if not (math.isfinite(a) and math.isfinite(b))
    ]
    print(
        json.dumps(
            {
                "steps": len(losses),
                "first_nonfinite_step": bad[0] if bad else None,
                "nonfinite_steps": len(bad),
                "losses_first": losses[:8],
                "loss_last": losses[-1],
                "grad_norms_first": norms[:8],
                "sm_count_seen": props.multi_processor_count if props else None,
                "wall_s": time.perf_counter() - t0,
            }
        )
    )


def kiln_trainer(env: dict[str, str], work: pathlib.Path, steps: int, smoke: bool) -> dict[str, Any]:
    """kiln's own trainer (``python -m trainer``) on the best-effort job's spec, under the same caps."""
    spec = {
        "name": "sm-cap-probe",
        "team": "bench",
        "steps": steps,
        "seed": 0,
        "recipe": {"name": "gpt", "hyperparameters": {**(SMOKE_HP if smoke else HP), "log_every": 1}},
        "precision": "bf16" if not smoke else "fp32",
        "compile": {"mode": "whole" if not smoke else "off"},
        "checkpointing": {"every_steps": None, "keep_last": 1},
    }
    run_dir = work / "kiln"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    recs = [json.loads(line) for line in (run_dir / "telemetry" / "rank0.jsonl").read_text().splitlines() if line]
    steps_seen = [r for r in recs if r["kind"] == "step"]
    skipped = [r["fields"]["step"] for r in recs if r["kind"] == "event" and r["type"] == "NONFINITE_SKIPPED"]
    return {
        "exit_code": proc.returncode,
        "first_nonfinite_step": skipped[0] if skipped else None,
        "nonfinite_steps": len(skipped),
        "losses_first": [r["loss"] for r in steps_seen[:8]],
        "events": [r["type"] for r in recs if r["kind"] == "event" and r["type"] != "NONFINITE_SKIPPED"],
        "stderr_tail": proc.stderr[-1500:] if proc.returncode else "",
    }


class MpsDaemon:
    """A private MPS control daemon (its own pipe and log directories), quit when done."""

    def __init__(self, base: pathlib.Path) -> None:
        self.pipe, self.log = base / "pipe", base / "log"
        self.pipe.mkdir(parents=True)
        self.log.mkdir(parents=True)
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}
        binary = shutil.which("nvidia-cuda-mps-control") or "/usr/local/nvidia/bin/nvidia-cuda-mps-control"
        self.binary = binary
        subprocess.run([binary, "-d"], env={**os.environ, **self.env}, check=True, timeout=30)

    def quit(self) -> None:
        subprocess.run([self.binary], input="quit\n", text=True, env={**os.environ, **self.env}, timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU: no MPS, a tiny model, to check the harness")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile", default="whole", choices=["whole", "off"], help=argparse.SUPPRESS)
    ap.add_argument("--sdpa", default="auto", choices=["auto", "math", "flash", "efficient", "cudnn"])
    ap.add_argument("--blas-setting", default="", help=argparse.SUPPRESS)
    ap.add_argument("--adamw", default="fused", choices=["fused", "foreach"], help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help=argparse.SUPPRESS)
    ap.add_argument("--blas", action="store_true", help="check each GEMM of the model under each BLAS setting")
    ap.add_argument("--blas-child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--sm", type=int, default=30, help="the SM percentage of --blas")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "sm_cap_probe.json")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.blas_child:
        blas_child(args.blas_child, 64 if args.smoke else 32 * 1024, args.smoke)
        return
    if args.blas:
        blas(args)
        return
    names = [v for v in args.variants.split(",") if v]
    if unknown := set(names) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    work = pathlib.Path(tempfile.mkdtemp(prefix="kiln-sm-cap-"))
    daemon = None if args.smoke else MpsDaemon(work / "mps")
    result: dict[str, Any] = {"steps": args.steps, "hyperparameters": SMOKE_HP if args.smoke else HP, "variants": {}}
    try:
        for name in names:
            sm, mem, child_args = VARIANTS[name]
            env = {**os.environ, **(daemon.env if daemon else {})}
            if daemon and sm is not None:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm)
            if daemon and mem is not None:
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mem}M"
            if name.endswith("_cold"):
                env["TORCHINDUCTOR_CACHE_DIR"] = str(work / name / "inductor")
                env["TRITON_CACHE_DIR"] = str(work / name / "triton")
            t0 = time.time()
            try:
                if child_args is None:
                    out = kiln_trainer(env, work / name, args.steps, args.smoke)
                else:
                    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), *child_args]
                    proc = subprocess.run(
                        cmd + (["--smoke"] if args.smoke else []),
                        cwd=ROOT,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=600,
                    )
                    if proc.returncode != 0:
                        raise RuntimeError(proc.stderr[-2000:])
                    out = json.loads(proc.stdout.strip().splitlines()[-1])
            except Exception as exc:  # one variant's failure is recorded; the next ones still run
                out = {"error": repr(exc)[-2000:]}
            out["seconds"] = round(time.time() - t0, 1)
            result["variants"][name] = out
            print(
                f"{name}: first non-finite step {out.get('first_nonfinite_step')}, "
                f"{out.get('nonfinite_steps')} non-finite, losses {out.get('losses_first')}",
                flush=True,
            )
            save(result, args.out)  # after each variant: a run cut short by its time limit keeps what it found
    finally:
        if daemon:
            daemon.quit()
            result["mps_log_tail"] = {
                p.name: p.read_text()[-2000:] for p in sorted(daemon.log.glob("*.log")) if p.is_file()
            }
        save(result, args.out)


def blas(args: argparse.Namespace) -> None:
    """Each BLAS setting in its own process under the SM cap: the layers' GEMMs, then the model's first steps."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="kiln-sm-blas-"))
    daemon = None if args.smoke else MpsDaemon(work / "mps")
    result: dict[str, Any] = {"sm_percent": args.sm, "configs": {}}
    out_path = args.out.with_name(args.out.stem + "_blas.json")
    try:
        for name, (extra, setting) in BLAS_CONFIGS.items():
            env = {**os.environ, **(daemon.env if daemon else {}), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(args.sm)}
            env.update(extra)
            entry: dict[str, Any] = {"env": extra, "setting": setting}
            proc = subprocess.run(
                [sys.executable, __file__, "--blas-child", setting or "none", *(["--smoke"] if args.smoke else [])],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode == 0:
                entry.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            else:
                entry["error"] = proc.stderr[-1500:]
            if setting != "fp16":  # the model itself, eager (the fault shows at step 1 there)
                child_args = ["--child", "--steps", "3", "--compile", "off", "--blas-setting", setting]
                proc = subprocess.run(
                    [sys.executable, __file__, *child_args, *(["--smoke"] if args.smoke else [])],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                entry["model"] = (
                    json.loads(proc.stdout.strip().splitlines()[-1])
                    if proc.returncode == 0
                    else {"error": proc.stderr[-1500:]}
                )
            result["configs"][name] = entry
            bad = {
                layer: [k for k, v in r.items() if v["nonfinite"] or v["rel_err"] > 0.05]
                for layer, r in entry.get("layers", {}).items()
            }
            print(
                f"{name}: bad GEMMs { ({k: v for k, v in bad.items() if v}) }, "
                f"model grad norms {entry.get('model', {}).get('grad_norms_first')}",
                flush=True,
            )
            save(result, out_path)
    finally:
        if daemon:
            daemon.quit()
        save(result, out_path)


def save(result: dict[str, Any], out: pathlib.Path) -> None:
    text = json.dumps(result, indent=2) + "\n"
    out.write_text(text)
    if os.environ.get("OUT"):
        pathlib.Path(os.environ["OUT"], out.name).write_text(text)


if __name__ == "__main__":
    main()
