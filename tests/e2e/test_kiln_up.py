"""The README's first command, for real: `kiln up` on the embedded default (SQLite + kombu's SQLAlchemy
transport), then the main job through the CLI from "another terminal", trained to the end on the CPU by the
real scheduler, worker and trainer; then Ctrl-C, and nothing left running."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from harness.services import free_port, process_tree

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KILN = [sys.executable, "-m", "cli.main"]
JOB_TIMEOUT_S = float(os.environ.get("KILN_E2E_JOB_TIMEOUT_S", "480"))


@dataclass
class Up:
    proc: subprocess.Popen[str]
    url: str
    env: dict[str, str]
    home: Path
    out_path: Path

    def output(self) -> str:
        return self.out_path.read_text()

    def logs(self) -> str:
        parts = [f"--- kiln up ---\n{self.output()[-4000:]}"]
        for log in sorted((self.home / "logs").glob("*.log")):
            parts.append(f"--- {log.name} ---\n{log.read_text()[-4000:]}")
        return "\n".join(parts)

    def kiln(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*KILN, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)


def up_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONUNBUFFERED="1")
    return env


def start_up(tmp_path: Path, *extra: str, settings: dict[str, str] | None = None) -> Up:
    port = free_port()
    env = up_env(tmp_path) | (settings or {})
    out_path = tmp_path / "up.out"
    proc = subprocess.Popen(
        [*KILN, "up", "--port", str(port), "--cpu-slots", "1", "--grace", "20", *extra],
        cwd=ROOT,
        env=env,
        stdout=out_path.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    up = Up(proc, f"http://127.0.0.1:{port}", env, tmp_path / "home", out_path)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{up.url}/readyz", timeout=1).status_code == 200 and "kiln is up" in up.output():
                return up
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_up(up)
            pytest.fail(f"kiln up did not become ready:\n{up.logs()}")
        time.sleep(0.5)


@contextmanager
def up_running(tmp_path: Path, settings: dict[str, str] | None = None) -> Iterator[Up]:
    """``kiln up`` from ``tmp_path`` (:func:`start_up`), stopped at the end unless the test stopped it already."""
    up = start_up(tmp_path, settings=settings)
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            stop_up(up)


def stop_up(up: Up) -> tuple[int, list[psutil.Process]]:
    """SIGINT, as Ctrl-C would; return kiln up's exit code and the descendants it had."""
    try:
        children = psutil.Process(up.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    up.proc.send_signal(signal.SIGINT)
    try:
        code = up.proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        for p in [*children, psutil.Process(up.proc.pid)]:
            p.kill()
        raise
    return code, children


def wait_gone(procs: list[psutil.Process], timeout: float = 10) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _finished(up: Up, job_id: str) -> dict[str, object]:
    """The job as ``kiln describe`` shows it once it has ended."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        shown = up.kiln("describe", job_id, "-o", "json")
        assert shown.returncode == 0, shown.stderr
        job: dict[str, object] = json.loads(shown.stdout)["job"]
        if job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            return job
        time.sleep(2)
    pytest.fail(f"job {job_id} did not finish:\n{up.logs()}")


def test_kiln_up_runs_the_main_job_to_the_end(kiln_up: Up, tmp_path: Path) -> None:
    up = kiln_up
    config = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())
    assert config["api_url"] == up.url and config["token"].startswith("kiln_")
    # Off a terminal too (its output is a file here): the dashboard's sign-in token, as README and the page say.
    assert f"dashboard sign-in token (also in the CLI config): {config['token']}" in up.output()
    for name in ("api", "scheduler", "worker"):
        assert f"{name}" in up.output() and (up.home / "logs" / f"{name}.log").exists()

    submitted = up.kiln("submit", "examples/gpt-tiny.yaml")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.startswith("submitted job "), submitted.stdout
    job_id = submitted.stdout.split()[2]

    listed = up.kiln("ls")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == [job_id, "gpt-tiny"] for line in listed.stdout.splitlines()), listed.stdout

    job = _finished(up, job_id)
    assert job.get("state") == "SUCCEEDED", f"{job}\n{up.logs()}"
    assert job["last_step"] == 60 and job["last_loss"] is not None

    described = up.kiln("describe", job_id)
    assert described.returncode == 0
    for fragment in ("SUCCEEDED", "Attempts", "Recent events", "60/60"):
        assert fragment in described.stdout, described.stdout

    events = up.kiln("events", job_id, "-o", "json")
    types = [e["type"] for e in json.loads(events.stdout)]
    for expected in ("SUBMITTED", "ADMITTED", "RUNNING", "SUCCEEDED"):
        assert expected in types, types

    logs = up.kiln("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.strip(), "the trainer's log is empty"

    followed = up.kiln("logs", job_id, "-f", timeout=60)  # a finished job: the stream ends by itself
    assert followed.returncode == 0 and followed.stdout == logs.stdout

    code, children = stop_up(up)
    assert code == 0, up.output()
    assert len(children) >= 3  # api, scheduler, worker (and what they started)
    assert wait_gone(children) == [], up.output()
    assert "stopped (" in up.output()


def test_second_kiln_up_skips_bootstrap_and_a_concurrent_one_is_refused(tmp_path: Path) -> None:
    first = start_up(tmp_path, "--no-worker")
    try:
        assert "first run: created admin" in first.output()
        token = json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"]
        clash = subprocess.run(
            [*KILN, "up", "--port", str(free_port())],
            cwd=ROOT,
            env=first.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert clash.returncode == 8, clash.stdout + clash.stderr
        assert "another `kiln up`" in clash.stderr
    finally:
        code, children = stop_up(first)
    assert code == 0 and wait_gone(children) == []

    (tmp_path / "up.out").rename(tmp_path / "up.first.out")
    second = start_up(tmp_path, "--no-worker", "--submit", "examples/gpt-tiny.yaml")
    try:
        assert "bootstrap skipped" in second.output() and "still valid" in second.output(), second.output()
        deadline = time.monotonic() + 30
        while "submitted job" not in second.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "submitted job 1 (gpt-tiny)" in second.output(), second.output()
        assert json.loads((tmp_path / "xdg" / "kiln" / "config.json").read_text())["token"] == token
        assert second.kiln("whoami").returncode == 0
    finally:
        code, children = stop_up(second)
    assert code == 0 and wait_gone(children) == []


def test_a_second_database_on_the_host_never_resumes_from_the_firsts_local_tier(tmp_path: Path) -> None:
    """Two kiln databases on one host share its fast local checkpoint tier, and both number their first job 1.
    Seen on the H200: the second one's job 1 resumed from the first's checkpoint of its last step and ended
    SUCCEEDED at once, with the other job's loss."""
    spec = tmp_path / "tiered.yaml"
    spec.write_text(
        (ROOT / "examples" / "gpt-tiny.yaml")
        .read_text()
        .replace("  keep_last: 2\n", "  keep_last: 2\n  local_tier: true\n")
    )
    tier = {"KILN_LOCAL_TIER_DIR": str(tmp_path / "shm")}
    runs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        with up_running(tmp_path / name, settings=tier) as up:
            submitted = up.kiln("submit", str(spec))
            assert submitted.stdout.startswith("submitted job 1 "), submitted.stdout + submitted.stderr
            job = _finished(up, "1")
            events = json.loads(up.kiln("events", "1", "-o", "json").stdout)
            runs.append((job, [e["type"] for e in events], up.logs()))
    for job, types, logs in runs:
        assert job["state"] == "SUCCEEDED" and job["last_step"] == 60, logs
        assert "RESUMED" not in types, f"{types}\n{logs}"
        assert "CHECKPOINT_LOCAL" in types, types  # the tier was used, by both
    tiers = list((tmp_path / "shm").iterdir())
    assert len(tiers) == 2, tiers  # one directory per database


def test_kiln_up_serves_the_scheduler_and_worker_metrics(kiln_up: Up) -> None:
    """Issue 42, point 9: the scheduler and the worker export metrics of their own, which kiln up left off; it turns
    them on, on the ports after the API's, and says where (the API's /metrics needs a scrape token)."""
    line = next((x for x in kiln_up.output().splitlines() if "metrics:" in x), "")
    urls = dict(re.findall(r"(scheduler|worker) (http://\S+/metrics)", line))
    assert set(urls) == {"scheduler", "worker"} and f"{kiln_up.url}/metrics" in line, kiln_up.output()
    expected = {"scheduler": "kiln_scheduler_leader", "worker": "kiln_worker_last_heartbeat_timestamp_seconds"}
    for name, url in urls.items():
        deadline = time.monotonic() + 60  # the banner follows the API; each listener starts with its process
        while True:
            with contextlib.suppress(httpx.HTTPError):
                scraped = httpx.get(url, timeout=5)
                if scraped.status_code == 200 and expected[name] in scraped.text:
                    break
            assert time.monotonic() < deadline, f"{name}: nothing at {url}\n{kiln_up.logs()}"
            time.sleep(1)


def test_up_detach_returns_when_ready_and_down_stops_everything(tmp_path: Path) -> None:
    env, home, port = up_env(tmp_path), tmp_path / "home", free_port()

    def kiln(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*KILN, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)

    up = kiln("up", "--detach", "--port", str(port), "--no-worker", "--grace", "20")
    pid = int((home / "up.lock").read_text() or 0) if (home / "up.lock").exists() else 0
    # Handles taken while it runs: they never signal another process that got one of its pids later.
    procs = process_tree(pid) if up.returncode == 0 else []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "kiln is up" in up.stdout and "down" in up.stdout, up.stdout
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        assert len(procs) >= 3, procs  # kiln up, its API and its scheduler
        again = kiln("up", "--detach", "--port", str(free_port()))
        assert again.returncode == 8 and f"already up on {home} (pid {pid})" in again.stderr, again.stderr

        down = kiln("down")
        assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
        assert wait_gone(procs) == []
        assert "stopped (" in (home / "logs" / "up.log").read_text()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
        assert "kiln is not up" in kiln("down").stdout
    finally:
        for p in procs:  # what is left of it after a failure
            with contextlib.suppress(psutil.Error):
                p.kill()
