"""``kiln up``'s supervisor: the API, the scheduler and the worker as children, each in its own process group,
restarted with backoff when one dies, stopped worker first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)
TAG = "[dim]\\[kiln up][/]"

MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 30.0  # a child that ran this long before dying starts its backoff afresh


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]


def backoff_delay(failures: int) -> float:
    """1, 2, 4, 8, 16, 30, 30... seconds after the 1st, 2nd... consecutive quick failure."""
    if failures <= 0:
        return 0.0
    return min(2.0 ** (failures - 1), MAX_BACKOFF_S)


def tail(path: Path, lines: int = 8) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return list(deque(data.splitlines(), maxlen=lines))


@dataclass
class Child:
    spec: ChildSpec
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restarts: int = 0
    restart_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class Supervisor:
    def __init__(self, specs: list[ChildSpec], *, env: dict[str, str], log_dir: Path, out: Console = console):
        self.children = [Child(spec, log_dir / f"{spec.name}.log") for spec in specs]
        self.env = env
        self.out = out
        self.stopping = False

    def start(self, child: Child) -> None:
        if child.log is None or child.log.closed:
            child.log = child.log_path.open("ab")
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        child.log.write(f"\n=== kiln up: starting {child.name} at {stamp}: {' '.join(child.spec.argv)}\n".encode())
        child.log.flush()
        child.proc = subprocess.Popen(
            child.spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=child.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # its own process group: the terminal's Ctrl-C reaches only kiln up
        )
        child.started_at = time.monotonic()
        child.restart_at = None

    def start_all(self) -> None:
        for child in self.children:
            self.start(child)

    def poll(self) -> None:
        """Notice children that died, and restart them when their backoff has passed."""
        now = time.monotonic()
        for child in self.children:
            if self.stopping:
                return
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restarts += 1
                    self.start(child)
                    self.out.print(f"{TAG} {child.name} restarted (pid {child.pid}, restart {child.restarts})")
                continue
            if child.proc is None or child.proc.poll() is None:
                continue
            code = child.proc.returncode
            child.exit_codes.append(code)
            _reap_group(child.proc.pid)
            uptime = now - child.started_at
            # One that ran stably is restarted at once (a killed worker's jobs wait on it); quick failures back off.
            child.failures = 0 if uptime >= STABLE_AFTER_S else child.failures + 1
            delay = backoff_delay(child.failures)
            child.restart_at = now + delay
            self.out.print(
                f"{TAG} [red]{child.name} exited with code {code}[/] after {uptime:.0f}s; "
                f"restarting in {delay:.0f}s — last lines of {child.log_path}:"
            )
            for line in tail(child.log_path):
                self.out.print(f"    {line}", markup=False)

    def stop(self, grace_s: float, force: threading.Event) -> dict[str, int | None]:
        """Stop in reverse start order: SIGTERM, wait up to ``grace_s``, then SIGKILL the process group."""
        self.stopping = True
        codes: dict[str, int | None] = {}
        waves = [[c for c in self.children if c.name == "worker"], [c for c in self.children if c.name != "worker"]]
        for wave in waves:
            running = [c for c in wave if c.proc is not None and c.proc.poll() is None]
            for child in running:
                assert child.proc is not None
                self.out.print(f"{TAG} stopping {child.name} (pid {child.pid})")
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for child in running:
                assert child.proc is not None
                while child.proc.poll() is None and time.monotonic() < deadline and not force.is_set():
                    time.sleep(0.1)
                if child.proc.poll() is None:
                    self.out.print(f"{TAG} {child.name} did not stop in {grace_s:.0f}s: SIGKILL")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.proc.pid, signal.SIGKILL)
                    child.proc.wait()
        for child in self.children:
            if child.proc is not None:
                _reap_group(child.proc.pid)
                codes[child.name] = child.proc.returncode
            if child.log is not None:
                child.log.close()
        return codes


def stop_summary(codes: dict[str, int | None]) -> str:
    """How each child ended once ``stop`` was done, in words. A child that exits on kiln's own SIGTERM without
    handling it reports -15: that is the clean stop asked for, and "api -15" read as a failure."""
    said = []
    for name, code in codes.items():
        if code in (0, -signal.SIGTERM):
            said.append(f"{name} ok")
        elif code is None:
            said.append(f"{name} not started")
        elif code < 0:
            what = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            said.append(f"{name} killed by {what}")
        else:
            said.append(f"{name} exit {code}")
    return ", ".join(said)


def _reap_group(pgid: int) -> None:
    """Kill whatever is left in a child's process group (a trainer orphaned by a crashed worker)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        for _ in range(20):
            time.sleep(0.05)
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
