#!/usr/bin/env python3
"""A stand-in for ``nvidia-cuda-mps-control``, for hosts without a GPU (tests only; never on a production path:
the worker runs whatever ``KILN_MPS_CONTROL`` names, and only tests name this file).

It keeps the parts of the real binary's protocol that kiln's daemon supervision uses: ``-d`` starts a background
daemon (refused while one runs); with no arguments it reads one command from standard input and answers it
through the daemon found in ``$CUDA_MPS_PIPE_DIRECTORY``: ``get_server_list`` (exit 0 while the daemon lives),
``quit`` (the daemon ends). No daemon: exit 1 with the real binary's message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

pidfile = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "standin-daemon.pid"


def daemon_pid() -> int | None:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


if sys.argv[1:] == ["-d"]:
    if daemon_pid() is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    daemon = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pidfile.write_text(str(daemon.pid))
    sys.exit(0)

command = sys.stdin.read().strip()
pid = daemon_pid()
if pid is None:
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
if command == "quit":
    os.kill(pid, signal.SIGTERM)
    pidfile.unlink(missing_ok=True)
sys.exit(0)
