"""A worker that dies (SIGKILL) still has its attempts stop as they should: the sandbox's shim (workers/sandbox_shim.py)
sees the end of its lifeline and sends SIGTERM, so the trainer checkpoints and exits, as the parent-death signal
did before the sandbox (bubblewrap, set up as root, cannot deliver that signal to the team's uid). Real processes:
a stand-in worker launches a sandboxed command through TrainerProcess exactly as workers.launch does, and is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
WORKER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from workers.attempt_user import RANGE_START, AttemptUser
from workers.sandbox import Sandbox, View
from workers.supervisor import TrainerProcess
run = Path({run!r})
sandbox = Sandbox.detect([run.parent / "state"])
user = AttemptUser(RANGE_START + 3, RANGE_START + 3) if sandbox.as_root else None
if user is not None:
    os.chown(run, user.uid, user.gid)
trainer = "import signal, time, pathlib; " + (
    "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path('stopped').write_text('checkpointed'), exit(75))); "
    "pathlib.Path('started').write_text('yes'); time.sleep(60)")
proc = TrainerProcess([sys.executable, "-c", trainer], env={{"PATH": "/usr/bin:/bin"}}, log_path=run.parent / "a.log",
                      run_dir=run, cwd=run)
lifeline, holder = os.pipe()
launch = sandbox.command(proc.argv, View(writable=(run,), cwd=run, lifeline_fd=lifeline), user=user)
proc.argv, proc.pass_fds, proc.lifeline, proc.sandboxed = launch.argv, launch.fds, holder, True
proc.start()
time.sleep(60)
"""


def test_a_dead_workers_sandboxed_attempt_is_told_to_stop(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", WORKER.format(root=str(ROOT), run=str(run))], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (run / "started").exists() and time.monotonic() < deadline:
        assert worker.poll() is None, "the stand-in worker died"
        time.sleep(0.1)
    assert (run / "started").exists()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 20
    while not (run / "stopped").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (run / "stopped").read_text() == "checkpointed"
    if os.geteuid() == 0:
        assert (run / "stopped").stat().st_uid != 0  # written as the team's uid, inside the sandbox
