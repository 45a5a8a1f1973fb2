"""``kiln estimate`` held to account on one GPU host (issue 41, acceptance 1 and 4's GPU half), as a user meets it.

    .venv/bin/python bench/estimate_bench.py                          # on the GPU host (H100 or H200)
    .venv/bin/python bench/estimate_bench.py --prior h200.json        # ... predicting this type from another's runs
    .venv/bin/python bench/estimate_bench.py --smoke                  # CPU: tiny shapes, to check the harness (CI)

``./kiln up --detach`` on a new KILN_HOME, then, every job submitted with the CLI and run by kiln's worker:

1. ``prior`` (with ``--prior FILE``, another run of this bench on another GPU type): before anything runs here, each
   shape's step time on this host's type predicted from that file's measured runs, by ``core.estimate``'s cross-type
   scaling (the two types' published peaks); set against this run's measurements at the end;
2. ``calibrate``: the GPT recipe at two shapes (GPT-2 124M at seq 1024, and a narrower one) and the user-model
   example (``examples/gpt-user``, the team's own code: kiln cannot count its FLOPs, so only its own runs predict
   it), each for ``--steps`` steps;
3. ``predict``: ``kiln estimate FILE -o json`` for three GPT shapes not calibrated (another width, depth, sequence
   length) and the user-model example, all before any of them runs: the job as written's step time and peak memory;
4. ``measure``: each of them run; its steady steps' median (kiln's own rule: timed steps without kiln's checkpoint
   work, after the first fifth) and its peak memory per rank (the trainer's ``torch.cuda.max_memory_allocated``,
   in its step telemetry), beside the prediction: relative error, within 15% (step) and 5% (memory) or not;
5. ``advise`` (acceptance 4): ``kiln estimate`` on the shipped GPT example (``--steps`` steps instead of its 2,000,
   and a deadline ``--deadline-min`` minutes on: both stated in the JSON) recommends an option; the spec as written
   and the recommended one (when another) are run, their GPU-hours (attempts' wall time x GPUs) and ends against
   the deadline reported.

Planned for about 7 minutes on one H100: 8 jobs of ``--steps`` 60 (each ~15 s of start-up and up to ~25 s of cold
compile). JSON to ``--out`` (and to $OUT when set); progress with timestamps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_path_bench import ROOT, Kiln  # noqa: E402  (one driver of ./kiln)

VENV = ROOT / ".venv"
if VENV.exists() and pathlib.Path(sys.prefix).resolve() != VENV.resolve():  # core's arithmetic needs the venv
    os.execv(str(VENV / "bin" / "python"), [str(VENV / "bin" / "python"), *sys.argv])
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from core import estimate as est  # noqa: E402
from core.gpu_types import canonical  # noqa: E402
from core.repositories.step_times import WARMUP_STEPS  # noqa: E402
from core.services.calibration import config_of, shape_of  # noqa: E402
from core.services.estimate_queue import with_changes  # noqa: E402
from core.spec import check_recipe, parse_spec_data  # noqa: E402

STEP_WITHIN, MEMORY_WITHIN = 0.15, 0.05  # the acceptance
USER_EXAMPLE = ROOT / "examples" / "gpt-user"
GPT_EXAMPLE = ROOT / "examples" / "gpt2-124m-h100.yaml"
SMOKE_EXAMPLE = ROOT / "examples" / "gpt-tiny.yaml"

# name -> the GPT hyperparameters that differ from the base (GPU: GPT-2 124M at batch 16 x 1024; smoke: tiny)
GPU_CALIBRATE = {"gpt2": {}, "width512": {"n_embd": 512, "n_head": 8}}
GPU_TEST = {"width640": {"n_embd": 640, "n_head": 10}, "depth8": {"n_layer": 8}, "seq512": {"seq_len": 512}}
SMOKE_CALIBRATE = {"tiny": {}}
SMOKE_TEST = {"width96": {"n_embd": 96}}


def log(msg: str) -> None:
    print(f"[estimate {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gpt_spec(name: str, changes: dict[str, Any], *, steps: int, smoke: bool) -> dict[str, Any]:
    if smoke:
        hp = {"size": "tiny", "corpus": "stdlib", "batch_size": 8, "seq_len": 128, "lr": 0.003}
        resources, precision, compile_ = {"gpus": 0, "cpu_slots": 1}, "fp32", {"mode": "off"}
    else:
        hp = {"size": "gpt2", "corpus": "stdlib", "batch_size": 16, "seq_len": 1024, "lr": 6e-4}
        resources, precision, compile_ = {"gpus": 1}, "bf16", {"mode": "whole"}
    return {
        "name": name,
        "team": "default",
        "recipe": {"name": "gpt", "hyperparameters": {**hp, **changes}},
        "steps": steps,
        "resources": resources,
        "compile": compile_,
        "precision": precision,
        "checkpointing": {"every_steps": 10_000, "keep_last": 1},  # no save inside the measured steps
        "sla": {"qos": "silver"},
    }


def example_spec(path: pathlib.Path, *, steps: int, deadline: datetime | None = None) -> dict[str, Any]:
    """A shipped example as a user would edit it for this host: any GPU type, ``steps`` steps, a deadline."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    data["steps"] = steps
    data.get("resources", {}).pop("gpu_type", None)
    data.setdefault("checkpointing", {})["every_steps"] = 10_000
    if deadline is not None:
        data.setdefault("sla", {})["deadline"] = deadline.isoformat()
    return data


def relative(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


class Bench:
    def __init__(self, args: argparse.Namespace, work: pathlib.Path) -> None:
        self.args, self.work = args, work
        self.kiln = Kiln(work / "home", args.port)
        self.device = "cpu"

    def write(self, name: str, spec: dict[str, Any]) -> pathlib.Path:
        path = self.work / f"{name}.json"
        path.write_text(json.dumps(spec))
        return path

    def up(self) -> None:
        t0 = time.time()
        self.kiln.up()
        until = time.time() + 120
        while not self.args.smoke:  # the worker registers its host (and its GPUs) once it is up
            gpus = self.kiln.get("/v1/gpus")["items"]
            if gpus:
                self.device = canonical(gpus[0]["model"])
                break
            if time.time() > until:
                raise RuntimeError("no GPU registered 120 s after kiln up")
            time.sleep(1)
        log(f"kiln up in {time.time() - t0:.0f} s; device {self.device}")

    def submit(self, name: str, spec: dict[str, Any], workdir: pathlib.Path | None = None) -> int:
        path = self.write(name, spec)
        extra = ["--workdir", str(workdir)] if workdir else []
        proc = self.kiln.cli("submit", str(path), *extra, "--output", "json")
        if proc.returncode != 0:
            raise RuntimeError(f"submit {name} failed: {proc.stdout}{proc.stderr}")
        return int(json.loads(proc.stdout)["id"])

    def estimate(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        proc = self.kiln.cli("estimate", str(self.write(f"estimate-{name}", spec)), "-o", "json")
        if proc.returncode != 0:
            raise RuntimeError(f"estimate {name} failed: {proc.stdout}{proc.stderr}")
        answer: dict[str, Any] = json.loads(proc.stdout)
        return answer

    def run(self, name: str, spec: dict[str, Any], workdir: pathlib.Path | None = None) -> dict[str, Any]:
        """Submit, wait for SUCCEEDED, and read what it measured: steady steps, peak memory, GPU-hours."""
        t0 = time.time()
        job = self.submit(name, spec, workdir)
        done = self.kiln.wait(job, lambda j: j["state"] == "SUCCEEDED", self.args.job_timeout, "SUCCEEDED")
        attempt = self.kiln.attempts(job)[-1]
        recs = self.kiln.telemetry(job, attempt["number"])
        steps = [r for r in recs if r["kind"] == "step" and r.get("step_time_s") and not r.get("overhead")]
        steady = steps[min(len(steps) // 5, WARMUP_STEPS) :]  # kiln's own rule (core.repositories.estimates)
        times = [float(r["step_time_s"]) for r in steady]
        peaks = [int(r["mem_peak_bytes"]) for r in recs if r["kind"] == "step" and r.get("mem_peak_bytes")]
        finished = next((r for r in recs if r["kind"] == "done"), {})
        ended = attempt["ended_at"] or datetime.now(UTC).isoformat()
        wall = _ts(ended) - _ts(attempt["started_at"])
        out = {
            "job_id": job,
            "spec": spec,
            "device": self.device,
            "steady_step_times": times,
            "median_step_s": statistics.median(times) if times else None,
            "startup_s": round(steps[0]["ts"] - _ts(attempt["started_at"]), 3) if steps else None,
            "peak_bytes": max(peaks) if peaks else finished.get("measured_peak_bytes"),
            "trainer_predicted_peak_bytes": finished.get("predicted_peak_bytes"),
            "gpu_hours": wall * max(1, int(spec["resources"].get("gpus") or 0)) / 3600,
            "ended_at": ended,
            "state": done["state"],
            "wall_s": round(time.time() - t0, 1),
        }
        log(f"{name}: job {job}, median step {out['median_step_s']}, peak {out['peak_bytes']}, {out['wall_s']} s")
        return out


def predicted(answer: dict[str, Any]) -> dict[str, Any]:
    """The job as written's figures in ``kiln estimate``'s answer."""
    written = answer["options"][0]
    step = written["step_time"] or {}
    return {
        "step_s": step.get("median_s"),
        "step_basis": step.get("label"),
        "step_detail": step.get("detail"),
        "peak_bytes": written["peak_memory_bytes"],
        "memory_basis": written["memory_basis"],
    }


def compare(pred: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    step_err = relative(pred.get("step_s"), measured["median_step_s"])
    mem_err = relative(pred.get("peak_bytes"), measured["peak_bytes"])
    return {
        "predicted_step_s": pred.get("step_s"),
        "measured_step_s": measured["median_step_s"],
        "step_error": step_err,
        "step_within_15pct": None if step_err is None else abs(step_err) <= STEP_WITHIN,
        "predicted_peak_bytes": pred.get("peak_bytes"),
        "measured_peak_bytes": measured["peak_bytes"],
        "memory_error": mem_err,
        "memory_within_5pct": None if mem_err is None else abs(mem_err) <= MEMORY_WITHIN,
    }


def prior_predictions(path: pathlib.Path, specs: dict[str, dict[str, Any]], device: str) -> dict[str, Any]:
    """Each spec's step time on ``device`` from the prior file's measured runs (another GPU type's), made before
    anything runs here: ``core.estimate.step_time`` with those runs as the only history (cross-type scaling)."""
    prior = json.loads(path.read_text())
    runs = []
    for name, r in prior["runs"].items():
        spec = parse_spec_data(r["spec"])
        config = config_of(spec, r["device"], strategy=None, fell_back=False)
        shape = shape_of(spec, check_recipe(spec))
        runs.append(est.Run(shape, config, tuple(r["steady_step_times"]), r["startup_s"], r["peak_bytes"]))
        log(f"prior: {name} on {r['device']}, median {r['median_step_s']}")
    out: dict[str, Any] = {"from": sorted({r.config.device for r in runs}), "to": device, "shapes": {}}
    for name, data in specs.items():
        spec = parse_spec_data(data)
        s = est.step_time(
            shape_of(spec, check_recipe(spec)), config_of(spec, device, strategy=None, fell_back=False), runs
        )
        out["shapes"][name] = {
            "step_s": s.median_s if s else None,
            "low_s": s.low_s if s else None,
            "high_s": s.high_s if s else None,
            "basis": s.label if s else None,
            "detail": s.detail if s else None,
        }
    return out


def advise(bench: Bench, steps: int, deadline_min: float, smoke: bool) -> dict[str, Any]:
    """Acceptance 4: the shipped example's estimate (a deadline set, steps cut) and runs of its recommendation."""
    deadline = datetime.now(UTC) + timedelta(minutes=deadline_min)
    spec = example_spec(SMOKE_EXAMPLE if smoke else GPT_EXAMPLE, steps=steps, deadline=deadline)
    answer = bench.estimate("example", spec)
    best = answer["recommended"]
    log(f"example: {answer['summary']} | {(answer.get('queue') or {}).get('sentence')}")
    written = bench.run("example-written", spec)
    out: dict[str, Any] = {
        "example": str((SMOKE_EXAMPLE if smoke else GPT_EXAMPLE).relative_to(ROOT)),
        "steps_override": steps,
        "deadline": deadline.isoformat(),
        "summary": answer["summary"],
        "queue": answer.get("queue"),
        "recommended": None if best is None else answer["options"][best],
        "written": written,
    }
    recommended = written
    if best not in (None, 0):
        changed = with_changes(parse_spec_data(spec), answer["options"][best]["changes"]).model_dump(mode="json")
        recommended = bench.run("example-recommended", changed)
        out["recommended_run"] = recommended
    out["recommended_is_written"] = best in (None, 0)
    out["gpu_hours_written"] = written["gpu_hours"]
    out["gpu_hours_recommended"] = recommended["gpu_hours"]
    out["recommended_costs_no_more"] = recommended["gpu_hours"] <= written["gpu_hours"] * 1.0001
    out["recommended_meets_deadline"] = _ts(recommended["ended_at"]) <= deadline.timestamp()
    return out


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def user_spec(steps: int) -> dict[str, Any]:
    return example_spec(USER_EXAMPLE / "job.yaml", steps=steps)


def accuracy(bench: Bench, result: dict[str, Any]) -> None:
    """Calibrate, predict every test shape before any runs, then run and compare (acceptance 1)."""
    args = bench.args
    calibrate = SMOKE_CALIBRATE if args.smoke else GPU_CALIBRATE
    tests = SMOKE_TEST if args.smoke else GPU_TEST
    specs = {n: gpt_spec(n, c, steps=args.steps, smoke=args.smoke) for n, c in {**calibrate, **tests}.items()}
    user = not args.smoke and not args.no_user_model
    if user:
        specs["user-model"] = user_spec(args.steps)
    if args.prior:
        result["prior"] = prior_predictions(args.prior, specs, bench.device)
    runs: dict[str, Any] = result.setdefault("runs", {})
    for name in calibrate:
        runs[name] = bench.run(name, specs[name])
    if user:
        runs["user-model-calibration"] = bench.run("user-model-calibration", specs["user-model"], USER_EXAMPLE)
    targets = [*tests, *(["user-model"] if user else [])]
    preds = {name: predicted(bench.estimate(name, specs[name])) for name in targets}
    for name, p in preds.items():
        log(f"predicted {name}: {p['step_s']} s a step ({p['step_basis']}), peak {p['peak_bytes']}")
    shapes: dict[str, Any] = {}
    for name in targets:
        runs[name] = bench.run(name, specs[name], USER_EXAMPLE if name == "user-model" else None)
        shapes[name] = {**compare(preds[name], runs[name]), "basis": preds[name]["step_basis"]}
        shapes[name]["detail"] = preds[name]["step_detail"]
        c = shapes[name]
        log(
            f"{name}: step predicted {c['predicted_step_s']} s ({c['basis']}), measured {c['measured_step_s']} s, "
            f"error {c['step_error']}; peak predicted {c['predicted_peak_bytes']}, measured {c['measured_peak_bytes']}"
            f", error {c['memory_error']}"
        )
    result["shapes"] = shapes
    if "prior" in result:
        for name, p in result["prior"]["shapes"].items():
            measured = runs.get(name) or runs.get(f"{name}-calibration")
            if measured is not None:
                p["measured_step_s"] = measured["median_step_s"]
                p["step_error"] = relative(p["step_s"], measured["median_step_s"])
                p["within_range"] = p["low_s"] is not None and p["low_s"] <= measured["median_step_s"] <= p["high_s"]


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"device": result.get("device")}
    for name, s in result.get("shapes", {}).items():
        out[name] = {
            "step_error": s["step_error"],
            "step_ok": s["step_within_15pct"],
            "memory_error": s["memory_error"],
            "memory_ok": s["memory_within_5pct"],
        }
    if "prior" in result:
        out["prior_step_errors"] = {n: p.get("step_error") for n, p in result["prior"]["shapes"].items()}
    if "advise" in result:
        a = result["advise"]
        out["advise"] = {k: a[k] for k in ("recommended_is_written", "recommended_costs_no_more")}
        out["advise"]["recommended_meets_deadline"] = a["recommended_meets_deadline"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU: tiny GPT shapes, one calibration and one test shape")
    p.add_argument("--steps", type=int, default=None, help="steps of each job (default 60; smoke 30)")
    p.add_argument("--deadline-min", type=float, default=20.0, help="the example's deadline, minutes from its estimate")
    p.add_argument("--prior", type=pathlib.Path, default=None, help="this bench's JSON from another GPU type")
    p.add_argument("--no-user-model", action="store_true", help="leave out the user-model example (GPU only)")
    p.add_argument("--no-advise", action="store_true", help="leave out acceptance 4's example runs")
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--port", type=int, default=None, help="the API's port (default: a free one)")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "estimate_bench.json")
    args = p.parse_args()
    from compile_cache_bench import free_port, save  # its helpers: a free port; JSON to --out and $OUT

    args.port = args.port or free_port()
    args.steps = args.steps or (30 if args.smoke else 60)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "started": time.time()}
    with tempfile.TemporaryDirectory(prefix="kiln-estimate-bench-") as tmp:
        bench = Bench(args, pathlib.Path(tmp))
        try:
            bench.up()
            result["device"] = bench.device
            accuracy(bench, result)
            if not args.no_advise:
                result["advise"] = advise(bench, args.steps, args.deadline_min, args.smoke)
            result["verdicts"] = verdicts(result)
        finally:
            result["wall_s"] = round(time.time() - result.pop("started"), 1)
            with contextlib.suppress(OSError), open(pathlib.Path(tmp) / "home" / "logs" / "up.log") as f:
                result["up_log_tail"] = f.read()[-4000:]
            bench.kiln.cli("down", timeout=300)
            save(result, args.out)


if __name__ == "__main__":
    main()
