"""The GPU path as a user meets it: a fresh ``kiln up`` on a GPU host, the shipped example, a worker killed.

    python3 bench/gpu_path_bench.py            # on the H200 host (offline: PIP_NO_INDEX=1 PIP_FIND_LINKS=wheels)
    python3 bench/gpu_path_bench.py --smoke    # CPU: the same steps with a tiny CPU spec, to check the harness

1. ``./kiln up --detach`` on a new KILN_HOME: the embedded default (SQLite, the SQLAlchemy broker), as the README
   starts it; what it says about the host is kept;
2. the bound: ``bench/trainer_bench.py --bare`` on the same model and batch (a hand-written whole-model compiled
   loop with fused AdamW and on-device random tokens), in the same run;
3. ``./kiln submit examples/gpt2-124m-h200.yaml --follow`` as shipped: it must succeed; its tokens/s are the
   trainer's own, as the worker ran it (the whole run, checkpoints included, and the median step);
4. the same spec again (an uninterrupted twin is the first run); at ``--kill-at`` of its steps, SIGKILL of the
   worker's whole process group; ``kiln up`` restarts the worker; each part of the recovery is timed from the
   database's events and the trainer's telemetry; the final loss is compared with the twin's;
5. every SLA event of both jobs (none may come from kiln's own checkpointing);
6. the same spec a third time, held with ``kiln hold`` at ``--hold-at`` of its steps while it runs: its worker stops
   it (the trainer checkpoints on SIGTERM), it waits in the queue held, ``kiln release`` puts it back, and it
   resumes from that checkpoint; the stop and the resume are timed and the final loss compared with the twin's.
Only the standard library here: the CLI does the rest. JSON to ``--out`` (and to $OUT when set).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from datetime import datetime
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gpt2-124m-h200.yaml"
SMOKE_SPEC = """name: smoke
team: default
recipe: {name: gpt, hyperparameters: {size: tiny, corpus: stdlib, batch_size: 8, seq_len: 128, lr: 0.003}}
steps: 400
resources: {gpus: 0, cpu_slots: 1}
compile: {mode: "off"}
precision: fp32
checkpointing: {every_steps: 20, keep_last: 2}
sla: {qos: silver, step_time_tolerance: 1.3}
"""


def log(msg: str) -> None:
    print(f"[gpu-path {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ts(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


class Kiln:
    """``./kiln`` on a private KILN_HOME and CLI config, and the API through the token ``kiln up`` saved."""

    def __init__(self, home: pathlib.Path, port: int) -> None:
        self.home, self.port = home, port
        self.env = {
            **os.environ,
            "KILN_HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "PYTHONUNBUFFERED": "1",
        }
        self.api = f"http://127.0.0.1:{port}"
        self.token = ""

    def cli(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ROOT / "kiln"), *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def up(self) -> str:
        t0 = time.time()
        proc = self.cli("up", "--detach", "--port", str(self.port), timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"kiln up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        self.token = json.loads((self.home / "config" / "kiln" / "config.json").read_text())["token"]
        log(f"kiln up in {time.time() - t0:.1f} s")
        return proc.stdout + proc.stderr

    def get(self, path: str) -> Any:
        req = urllib.request.Request(self.api + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def events(self, job_id: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.get(f"/v1/jobs/{job_id}/events?after={after}&limit=1000")
            out += page["items"]
            if not page["items"] or page["next_after"] is None or len(page["items"]) < 1000:
                return out
            after = page["next_after"]

    def attempts(self, job_id: int) -> list[dict[str, Any]]:
        """The job's attempts, oldest first (a job has a few: one page holds them)."""
        return list(self.get(f"/v1/jobs/{job_id}/attempts?limit=500")["items"])

    def submit(self, spec: pathlib.Path) -> int:
        proc = self.cli("submit", str(spec), "--output", "json")
        if proc.returncode != 0:
            raise RuntimeError(f"submit failed: {proc.stdout}{proc.stderr}")
        return int(json.loads(proc.stdout)["id"])

    def wait(self, job_id: int, done: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.time() + timeout
        seen, said_at = None, 0.0
        while time.time() < deadline:
            job: dict[str, Any] = self.get(f"/v1/jobs/{job_id}")
            if done(job):
                return job
            # Progress in the log (a state change at once, else every 30 s): a run cut by its time limit says where.
            now_seen = (job["state"], job.get("pending_reason"))
            if now_seen != seen or time.time() - said_at > 30:
                reason = job.get("pending_reason")
                why = f" ({reason}: {job.get('pending_message')})" if reason else ""
                log(f"job {job_id} {job['state']} at step {job.get('last_step')}{why}, waiting for {what}")
                seen, said_at = now_seen, time.time()
            if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):  # it ended without reaching what was awaited
                raise RuntimeError(
                    f"job {job_id} {job['state']} at step {job.get('last_step')} before {what}: "
                    f"{job.get('exit_reason')}"
                )
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id}: {what} not reached in {timeout:.0f} s")

    def worker_pid(self) -> int:
        """The current worker's pid, from kiln up's own log (its start banner and each restart's line)."""
        text = (self.home / "logs" / "up.log").read_text()
        pids = re.findall(r"worker\s+(?:pid |restarted \(pid )(\d+)", text)
        return int(pids[-1])

    def telemetry(self, job_id: int, attempt: int) -> list[dict[str, Any]]:
        path = self.home / "storage" / "runs" / str(job_id) / str(attempt) / "telemetry" / "rank0.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        out = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):  # a SIGKILL may cut the last line
                out.append(json.loads(line))
        return out


def run_summary(recs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """``tokens_per_s_steady``: over the step records after the warm-up, checkpoints between them included (the
    trainer bench's measure); ``_run``: the trainer's own, from its first step to its final durable save."""
    steps = [r for r in recs if r["kind"] == "step"]
    done = next((r for r in recs if r["kind"] == "done"), {})
    window = [s for s in steps if s["step"] > (steps[0]["step"] if steps else 0) + warmup]
    per_step = round(window[0]["tokens_per_s"] * window[0]["step_time_s"]) if window else 0  # tokens in a step
    steady = None
    if len(window) >= 2 and per_step:
        steady = per_step * (len(window) - 1) / (window[-1]["ts"] - window[0]["ts"])
    clean = [s["tokens_per_s"] for s in steps if s["step"] > warmup and s.get("tokens_per_s") and not s.get("overhead")]
    marked: dict[str, int] = {}
    for s in steps:
        marked[str(s.get("overhead"))] = marked.get(str(s.get("overhead")), 0) + 1
    compile_ev = next(
        (r for r in recs if r["kind"] == "event" and r["type"].startswith(("COMPILE_OK", "FALLBACK"))), None
    )
    return {
        "steps": len(steps),
        "tokens_per_s_run": done.get("tokens_per_s"),
        "tokens_per_s_steady": steady,
        "tokens_per_s_median_step": statistics.median(clean) if clean else None,
        "final_loss": done.get("final_loss"),
        "steps_by_overhead": marked,
        "compile": compile_ev["fields"] if compile_ev else None,
        "predicted_peak_bytes": done.get("predicted_peak_bytes"),
        "measured_peak_bytes": done.get("measured_peak_bytes"),
        "checkpoints": done.get("checkpoints"),
        "checkpoints_persisted": done.get("checkpoints_persisted"),
    }


def curve(recs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    steps = [r for r in recs if r["kind"] == "step"]
    return {
        "step": [s["step"] for s in steps],
        "loss": [s["loss"] for s in steps],
        "step_time_s": [round(s["step_time_s"], 5) for s in steps],
        "overhead": [s.get("overhead") for s in steps],
    }


def agreement(curves: dict[str, dict[str, list[Any]]], resumed_from: int | None) -> dict[str, Any]:
    """How far the killed job's losses are from the twin's at the same steps: before the kill (the same spec on
    the same GPU, nothing restored: the GPU's own run-to-run difference) and after the resume."""
    twin = dict(zip(curves["twin"]["step"], curves["twin"]["loss"], strict=True))

    def diffs(name: str, lo: int, hi: int) -> dict[str, Any]:
        pairs = [
            (s, loss)
            for s, loss in zip(curves[name]["step"], curves[name]["loss"], strict=True)
            if lo <= s <= hi and s in twin
        ]
        rel = [abs(loss - twin[s]) / abs(twin[s]) for s, loss in pairs if twin[s]]
        return {
            "steps": len(rel),
            "first_step": pairs[0][0] if pairs else None,
            "max_rel": max(rel) if rel else None,
            "median_rel": statistics.median(rel) if rel else None,
        }

    end = max(curves["twin"]["step"] or [0])
    start = (resumed_from or 0) + 1
    return {
        "before_kill": diffs("victim_1", 1, start - 1),
        "first_10_after_resume": diffs("victim_2", start, start + 9),
        "after_resume": diffs("victim_2", start, end),
    }


def bare(kiln: Kiln, spec: pathlib.Path, smoke: bool, steps: int) -> dict[str, Any]:
    py = ROOT / ".venv" / "bin" / "python"
    cmd = [
        str(py),
        str(ROOT / "bench" / "trainer_bench.py"),
        "--bare",
        "--hp-from-spec",
        str(spec),
        "--steps",
        str(steps),
        "--warmup",
        "5" if smoke else "20",
        "--compile",
        "off" if smoke else "whole",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=kiln.env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"bare loop failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def recovery(kiln: Kiln, job_id: int, kill_t: float) -> dict[str, Any]:
    """Each part of the recovery after the kill, from the database's events and the trainer's telemetry."""
    events = kiln.events(job_id)
    after = [e for e in events if (ts(e["created_at"]) or 0) >= kill_t - 1]

    def first(type_: str) -> dict[str, Any] | None:
        return next((e for e in after if e["type"] == type_), None)

    lost, admitted, running, recovered = first("LOST"), first("ADMITTED"), first("RUNNING"), first("RECOVERED")
    attempts = kiln.attempts(job_id)
    second = attempts[-1]
    recs = kiln.telemetry(job_id, second["number"])
    start = recs[0]["ts"] if recs else None
    resumed = next((r for r in recs if r["kind"] == "resumed"), None)
    compile_ev = next(
        (r for r in recs if r["kind"] == "event" and r["type"].startswith(("COMPILE_OK", "FALLBACK"))), None
    )
    first_step = next((r for r in recs if r["kind"] == "step"), None)
    started = next((r for r in recs if r["kind"] == "diagnostic" and r["type"] == "STARTED"), None)
    memory = next((r for r in recs if r["kind"] == "memory_prediction"), None)
    marks = {
        "kill": kill_t,
        "lost": ts(lost["created_at"]) if lost else None,
        "admitted": ts(admitted["created_at"]) if admitted else None,
        "running": ts(running["created_at"]) if running else None,
        "process_start": started["fields"]["process_start_ts"] if started else None,
        "trainer_first_record": start,
        "model_built": memory["ts"] if memory else None,
        "compiled": compile_ev["ts"] if compile_ev else None,
        "resumed": resumed["ts"] if resumed else None,
        "first_step": first_step["ts"] if first_step else None,
    }

    def span(a: str, b: str) -> float | None:
        return None if marks[a] is None or marks[b] is None else round(marks[b] - marks[a], 3)  # type: ignore[operator]

    return {
        "parts_s": {
            "detection (kill -> LOST, the restarted worker's registration)": span("kill", "lost"),
            "requeue and admission (LOST -> ADMITTED)": span("lost", "admitted"),
            "dispatch and claim (ADMITTED -> RUNNING)": span("admitted", "running"),
            "launch (RUNNING -> trainer process start)": span("running", "process_start"),
            "imports (process start -> first telemetry)": span("process_start", "trainer_first_record"),
            "model built (first telemetry -> memory prediction)": span("trainer_first_record", "model_built"),
            "warm compile (memory prediction -> compiled)": span("model_built", "compiled"),
            "restore (compiled -> RESUMED)": span("compiled", "resumed"),
            "first step (RESUMED -> first step)": span("resumed", "first_step"),
        },
        "kill_to_first_resumed_step_s": span("kill", "first_step"),
        "compile": compile_ev["fields"] if compile_ev else None,
        "resumed_from_step": resumed["step"] if resumed else None,
        "lost_event": {k: lost[k] for k in ("message", "data")} if lost else None,
        "recovered_event": recovered["data"] if recovered else None,
        "attempts": [{k: a[k] for k in ("number", "state", "resumed_from_step", "exit_reason")} for a in attempts],
    }


def hold_and_release(kiln: Kiln, spec: pathlib.Path, hold_step: int, held_for_s: float) -> dict[str, Any]:
    """Hold a running job (Slurm's ``requeuehold``), keep it held ``held_for_s``, release it, let it finish."""
    job_id = kiln.submit(spec)
    kiln.wait(job_id, lambda j: j["state"] == "RUNNING" and j["last_step"] >= hold_step, 600, f"step {hold_step}")
    t_hold = time.time()
    proc = kiln.cli("hold", str(job_id), "--reason", "gpu path bench")
    if proc.returncode != 0:
        raise RuntimeError(f"kiln hold failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    held = kiln.wait(job_id, lambda j: j["state"] == "QUEUED" and j["held_at"], 300, "QUEUED held")
    t_queued = time.time()
    log(f"job {job_id} held at step {held['last_step']} after {t_queued - t_hold:.1f} s: {held['pending_message']}")
    time.sleep(held_for_s)
    still = kiln.get(f"/v1/jobs/{job_id}")
    t_release = time.time()
    proc = kiln.cli("release", str(job_id))
    if proc.returncode != 0:
        raise RuntimeError(f"kiln release failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    final = kiln.wait(job_id, lambda j: j["state"] == "SUCCEEDED", 900, "SUCCEEDED after the release")
    attempts = kiln.attempts(job_id)
    recs = kiln.telemetry(job_id, attempts[-1]["number"])
    resumed = next((r for r in recs if r["kind"] == "resumed"), None)
    first_step = next((r for r in recs if r["kind"] == "step"), None)
    return {
        "job_id": job_id,
        "hold_asked_at_step": hold_step,
        "hold_to_queued_held_s": round(t_queued - t_hold, 3),
        "stopped_at_step": held["last_step"],
        "pending_message": held["pending_message"],
        "still_held_before_release": {k: still[k] for k in ("state", "held_at", "pending_reason")},
        "resumed_from_step": resumed["step"] if resumed else None,
        "release_to_first_resumed_step_s": round(first_step["ts"] - t_release, 3) if first_step else None,
        "attempts": [{k: a[k] for k in ("number", "state", "resumed_from_step", "exit_reason")} for a in attempts],
        "events": [e["type"] for e in kiln.events(job_id)],
        "job": final,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU: a tiny spec instead of the shipped GPU example")
    ap.add_argument("--kill-at", type=float, default=0.4, help="fraction of the steps at which the worker dies")
    ap.add_argument(
        "--bare-steps",
        type=int,
        default=None,
        help="steps of the bare loop (default: as many as the job, so both see the same GPU clocks)",
    )
    ap.add_argument("--no-victim", action="store_true", help="no worker killed")
    ap.add_argument("--hold-at", type=float, default=0.5, help="fraction of the steps at which a job is held")
    ap.add_argument("--no-hold", action="store_true", help="no job held and released")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "gpu_path_bench.json")
    args = ap.parse_args()
    home = pathlib.Path(tempfile.mkdtemp(prefix="kiln-gpu-path-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kiln = Kiln(home, port)
    spec = EXAMPLE
    if args.smoke:
        spec = home / "smoke.yaml"
        spec.write_text(SMOKE_SPEC)
    result: dict[str, Any] = {"spec": str(spec.relative_to(ROOT)) if not args.smoke else "smoke", "host": {}}

    def save() -> None:
        text = json.dumps(result, indent=2, default=str)
        args.out.write_text(text + "\n")
        if os.environ.get("OUT"):
            pathlib.Path(os.environ["OUT"], args.out.name).write_text(text + "\n")

    try:
        result["kiln_up"] = kiln.up()
        log(result["kiln_up"].strip().splitlines()[-1] if result["kiln_up"].strip() else "kiln up: no output")
        up_log = (home / "logs" / "up.log").read_text()
        result["host"] = {"lines": [ln for ln in up_log.splitlines() if "this host" in ln or "team 'default'" in ln]}
        log("\n".join(result["host"]["lines"]))
        job_steps = int(re.search(r"^steps:\s*(\d+)", spec.read_text(), re.M).group(1))  # type: ignore[union-attr]
        bare_steps = args.bare_steps or (40 if args.smoke else job_steps)
        result["bare"] = bare(kiln, spec, args.smoke, bare_steps)
        log(f"bare loop: {result['bare']['tokens_per_s']:.0f} tokens/s over {bare_steps} steps")
        save()

        t0 = time.time()
        follow = kiln.cli("submit", str(spec), "--follow", timeout=900)
        out = follow.stdout + follow.stderr
        ids = re.findall(r"submitted job (\d+)", out)
        result["twin"] = {"follow_exit_code": follow.returncode, "follow_tail": out[-1500:], "wall_s": time.time() - t0}
        if follow.returncode != 0 or not ids:
            raise RuntimeError(f"the shipped example did not succeed ({follow.returncode}):\n{out[-3000:]}")
        twin = int(ids[0])
        result["twin"].update(job_id=twin, **run_summary(kiln.telemetry(twin, 1), warmup=20))
        result["twin"]["job"] = kiln.get(f"/v1/jobs/{twin}")
        log(f"twin job {twin}: SUCCEEDED, {result['twin']['tokens_per_s_run']:.0f} tokens/s over the run")
        save()

        # The bare loop again: the GPU's clocks and temperature drift over minutes; the two bracket the job.
        result["bare_after"] = bare(kiln, spec, args.smoke, bare_steps)
        log(f"bare loop after the job: {result['bare_after']['tokens_per_s']:.0f} tokens/s")
        bound = max(result["bare"]["tokens_per_s"], result["bare_after"]["tokens_per_s"])
        result["ratio_vs_bare"] = {
            k: (result["twin"][f"tokens_per_s_{k}"] or 0) / bound for k in ("steady", "run", "median_step")
        }
        log(f"through the worker / the faster bare loop: {result['ratio_vs_bare']}")
        save()
        total = int(result["twin"]["job"]["steps"] or 0)
        if not args.no_hold:
            held = hold_and_release(kiln, spec, max(1, int(total * args.hold_at)), held_for_s=10.0)
            twin_loss = result["twin"]["job"]["last_loss"]
            held["final_loss_vs_twin"] = {"twin": twin_loss, "held": held["job"]["last_loss"]}
            result["held"] = held
            log(
                f"held job: stopped at step {held['stopped_at_step']}, resumed from {held['resumed_from_step']}, "
                f"release -> first step {held['release_to_first_resumed_step_s']} s, {held['job']['state']}, "
                f"final loss {held['final_loss_vs_twin']}"
            )
            save()
        if args.no_victim:
            return

        victim = kiln.submit(spec)
        kill_step = max(1, int(total * args.kill_at))
        kiln.wait(victim, lambda j: j["state"] == "RUNNING" and j["last_step"] >= kill_step, 600, f"step {kill_step}")
        pid = kiln.worker_pid()
        kill_t = time.time()
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        log(f"SIGKILL of the worker's process group (pid {pid}) at step ~{kill_step} of job {victim}")
        final = kiln.wait(victim, lambda j: j["state"] == "SUCCEEDED", 900, "SUCCEEDED after the kill")
        attempts = kiln.attempts(victim)
        result["victim"] = {
            "job_id": victim,
            "killed_at_step": kill_step,
            "worker_pid": pid,
            "job": final,
            "recovery": recovery(kiln, victim, kill_t),
            "resumed_attempt": run_summary(kiln.telemetry(victim, attempts[-1]["number"]), warmup=20),
        }
        log(f"victim recovered: {json.dumps(result['victim']['recovery']['parts_s'])}")
        result["curves"] = {
            name: curve(kiln.telemetry(job, attempt))
            for name, job, attempt in (
                ("twin", twin, 1),
                ("victim_1", victim, 1),
                ("victim_2", victim, attempts[-1]["number"]),
            )
        }
        result["loss_agreement"] = agreement(result["curves"], result["victim"]["recovery"]["resumed_from_step"])
        twin_loss, victim_loss = result["twin"]["job"]["last_loss"], final["last_loss"]
        result["final_loss"] = {
            "twin": twin_loss,
            "victim": victim_loss,
            "abs_diff": abs(twin_loss - victim_loss),
            "rel_diff": abs(twin_loss - victim_loss) / abs(twin_loss),
        }
        result["sla_events"] = {
            str(j): [
                {k: e[k] for k in ("type", "message", "created_at")}
                for e in kiln.events(j)
                if e["type"].startswith("SLA_")
            ]
            for j in (twin, victim)
        }
        log(
            f"through the worker / bare: {result['ratio_vs_bare']}; kill -> first resumed step "
            f"{result['victim']['recovery']['kill_to_first_resumed_step_s']} s; final loss {result['final_loss']}; "
            f"SLA events {result['sla_events']}"
        )
    except Exception as exc:
        result["error"] = repr(exc)
        with contextlib.suppress(OSError):
            for name in ("up.log", "worker.log", "scheduler.log", "api.log"):
                result.setdefault("logs", {})[name] = (home / "logs" / name).read_text()[-6000:]
        log(f"FAILED: {exc!r}")
        raise
    finally:
        down = kiln.cli("down", timeout=120)
        result["kiln_down"] = (down.stdout + down.stderr)[-500:]
        save()


if __name__ == "__main__":
    main()
