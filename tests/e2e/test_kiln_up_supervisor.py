"""`kiln up`'s supervisor on real child processes: a crashed child restarted with a backoff, one that ran stably
restarted at once, and a stop that kills what ignores SIGTERM and the grandchildren it orphaned."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from cli.server.supervisor import STABLE_AFTER_S, ChildSpec, Supervisor

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_supervisor_restarts_a_crashed_child_with_backoff(tmp_path: Path) -> None:
    crash = ChildSpec("crasher", [sys.executable, "-c", "print('boom', flush=True); raise SystemExit(3)"])
    stable = ChildSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    buf = io.StringIO()
    sup = Supervisor([stable, crash], env=dict(os.environ), log_dir=tmp_path, out=Console(file=buf, width=200))
    sup.start_all()
    crasher = sup.children[1]
    deadline = time.monotonic() + 20
    while crasher.restarts < 2 and time.monotonic() < deadline:
        sup.poll()
        time.sleep(0.05)
    codes = sup.stop(5.0, threading.Event())
    assert crasher.restarts >= 2
    assert crasher.exit_codes[:2] == [3, 3]
    text = buf.getvalue()
    assert "crasher exited with code 3" in text and "restarting in 1s" in text and "restarting in 2s" in text
    assert "boom" in text  # the log's tail is shown
    assert (tmp_path / "crasher.log").read_text().count("boom") >= 2
    assert codes["sleeper"] == -signal.SIGTERM
    assert all(not _alive(c.pid) for c in sup.children if c.pid)


def test_a_child_that_ran_stably_is_restarted_at_once(tmp_path: Path) -> None:
    """A worker killed after a long run is back without a backoff: its lost jobs wait on its registration."""
    code = "import sys, time; time.sleep(0.5); sys.exit(9)"
    buf = io.StringIO()
    sup = Supervisor(
        [ChildSpec("worker", [sys.executable, "-c", code])],
        env=dict(os.environ),
        log_dir=tmp_path,
        out=Console(file=buf, width=200),
    )
    sup.start_all()
    worker = sup.children[0]
    worker.started_at -= STABLE_AFTER_S  # as if it had run for longer than that
    deadline = time.monotonic() + 10
    while worker.restarts < 1 and time.monotonic() < deadline:
        sup.poll()
        time.sleep(0.05)
    sup.stop(5.0, threading.Event())
    assert worker.restarts == 1 and "restarting in 0s" in buf.getvalue()


def test_stop_kills_what_ignores_sigterm_and_orphaned_grandchildren(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    buf = io.StringIO()
    sup = Supervisor(
        [ChildSpec("stubborn", [sys.executable, "-c", code])],
        env=dict(os.environ),
        log_dir=tmp_path,
        out=Console(file=buf, width=200),
    )
    sup.start_all()
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    codes = sup.stop(1.0, threading.Event())
    assert codes["stubborn"] == -signal.SIGKILL
    assert "did not stop in 1s: SIGKILL" in buf.getvalue()
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
