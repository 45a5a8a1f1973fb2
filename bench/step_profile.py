"""Where a training step's time goes, kiln's trainer beside the bare compiled loop, with torch.profiler.

    python bench/step_profile.py --spec examples/gpt2-124m-h200.yaml     # on the GPU host
    python bench/step_profile.py --spec examples/gpt-tiny.yaml --smoke   # CPU: checks the harness

Both run in this process, on the spec's model and batch, compiled whole (on CPU: eager), and are profiled over
``--active`` steps after ``--wait`` steps: per step, the wall time, the GPU's kernel time and the number of kernel
launches, and the kernels whose time differs most between the two. A wall time above the kernel time is the GPU
waiting for the host; a kernel time above the bare loop's is work kiln adds. The kiln side is the trainer itself
(``trainer.loop.Trainer.train``), with no checkpoint due in the window; the profiler steps with each step the
loop reports (a bench-only wrapper of its ``_drain``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
from collections import Counter
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from core.spec import JobSpec, parse_spec_text  # noqa: E402


def summarize(prof: Any, steps: int, wall_s: float) -> dict[str, Any]:
    kernels: Counter[str] = Counter()
    launches = 0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.name[:90]] += evt.device_time  # microseconds
            launches += 1
    total = sum(kernels.values())
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall_s / steps,
        "kernel_ms_per_step": total / 1e3 / steps,
        "launches_per_step": launches / steps,
        "kernels_us": dict(kernels),
    }


def profiled(wait: int, active: int) -> Any:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=activities, schedule=schedule(wait=wait, warmup=2, active=active, repeat=1))


def run_kiln(spec: JobSpec, wait: int, active: int) -> dict[str, Any]:
    from core.telemetry import Telemetry
    from trainer.loop import Trainer
    from trainer.parallel import DistEnv

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="kiln-profile-"))
    os.environ["KILN_CHECKPOINT_DIR"] = str(run_dir / "ckpt")
    tel = Telemetry(run_dir, 0)
    trainer = Trainer(spec, run_dir, DistEnv(0, 0, 1, device, None), tel)
    prof = profiled(wait, active)
    marks: list[float] = []
    drain = trainer._drain

    def stepping(pending: Any, keep: int) -> bool:
        before = trainer.tokens_done
        out = drain(pending, keep)
        if trainer.tokens_done != before:  # a step was reported
            prof.step()
            marks.append(time.perf_counter())
        return out

    trainer._drain = stepping  # type: ignore[method-assign]
    with prof:
        trainer.train()
    first = wait + 2  # the active window's steps, by their report times
    wall = marks[first + active - 1] - marks[first - 1]
    return summarize(prof, active, wall)


def run_bare(spec: JobSpec, wait: int, active: int) -> dict[str, Any]:
    from bare_loop import gpt_batches

    from trainer.recipes.gpt import GPTRecipe, gpt_loss

    recipe = GPTRecipe(dict(spec.recipe.hyperparameters))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    if cuda:
        model.compile(fullgraph=True, dynamic=False)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4,
        betas=(0.9, 0.95),
        fused=cuda,
    )
    draw = gpt_batches(recipe, device)  # the job's own data, as kiln's side trains on
    prof = profiled(wait, active)
    marks = []
    previous: torch.Tensor | None = None
    with prof:
        for _ in range(wait + 2 + active):
            x, y = draw()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = gpt_loss(model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if previous is not None:
                previous.item()  # the previous step's loss, read once this one is queued: kiln's own lag of one
            previous = loss.detach()
            prof.step()
            marks.append(time.perf_counter())
    first = wait + 2
    return summarize(prof, active, marks[first + active - 1] - marks[first - 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", type=pathlib.Path, required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--wait", type=int, default=30)
    ap.add_argument("--active", type=int, default=20)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "step_profile.json")
    args = ap.parse_args()
    spec = parse_spec_text(args.spec.read_text())
    steps = args.wait + 2 + args.active + 5
    spec = spec.model_copy(
        update={
            "steps": steps,
            "checkpointing": spec.checkpointing.model_copy(update={"every_steps": 10 * steps, "local_dir": None}),
        }
    )
    bare = run_bare(spec, args.wait, args.active)
    kiln = run_kiln(spec, args.wait, args.active)
    names = set(bare["kernels_us"]) | set(kiln["kernels_us"])
    diff = sorted(((kiln["kernels_us"].get(n, 0) - bare["kernels_us"].get(n, 0)) / args.active, n) for n in names)
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "bare": {k: v for k, v in bare.items() if k != "kernels_us"},
        "kiln": {k: v for k, v in kiln.items() if k != "kernels_us"},
        "kernel_us_per_step_kiln_minus_bare": [(round(d, 1), n) for d, n in diff[:8] + diff[-15:]],
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.out.write_text(text + "\n")
    if os.environ.get("OUT"):
        pathlib.Path(os.environ["OUT"], args.out.name).write_text(text + "\n")


if __name__ == "__main__":
    main()
