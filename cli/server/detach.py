"""``kiln up --detach`` and ``kiln down``: kiln in the background, found again through its home lock.

``--detach`` starts the same ``kiln up`` (without ``--detach``) in a session of its own, its output in
``KILN_HOME/logs/up.log``, and returns once that ``kiln up`` has said it is up (its API answers and its whole banner is
in the log), or with the log's last lines if it died first.
``kiln down`` finds that process through ``KILN_HOME/up.lock`` (held with ``flock`` while kiln up runs, the pid
written in it) and asks it to stop as Ctrl-C would: SIGTERM, so the supervisor stops the worker (whose trainers
checkpoint), then the scheduler and the API; a second SIGTERM after ``--timeout`` kills what is left.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.app import cli_name
from cli.errors import CliError, ExitCode
from cli.server.supervisor import TAG, console, tail
from cli.server.up import BANNER_END, DETACHED_LOG, LOCK_FILE, api_ready, print_token
from core.private import open_private, private_dir

DOWN = "[dim]\\[kiln down][/]"


def running_pid(home: Path) -> int | None:
    """The pid of the ``kiln up`` holding ``home``'s lock, or None when none holds it."""
    path = home / LOCK_FILE
    if not path.exists():
        return None
    with path.open("r") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = fh.read().strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fh, fcntl.LOCK_UN)  # nobody held it: not running
        return None


def start_detached(up_args: list[str], home: Path, api_url: str, timeout_s: float = 180.0) -> int:
    pid = running_pid(home)
    if pid is not None:
        raise CliError(f"kiln is already up on {home} (pid {pid}); `kiln down` stops it", ExitCode.CONFLICT)
    log_path = private_dir(home / "logs") / DETACHED_LOG
    with open(open_private(log_path), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", *up_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this terminal
        )
    console.print(f"{TAG} starting in the background (pid {proc.pid}); log {log_path}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise CliError(
                f"kiln up exited with code {code} before it was ready; last lines of {log_path}:",
                details=tail(log_path, 15),
            )
        if api_ready(api_url) and BANNER_END in log_path.read_text(errors="replace"):
            from cli.config import load_file

            console.print(f"{TAG} [bold green]kiln is up[/] in the background: API {api_url}/v1, dashboard {api_url}/")
            token = load_file().get("token")  # kiln up saved the admin's token before it started the API
            if token:
                print_token(str(token))
            console.print(f"{TAG} stop it with: {cli_name()} down")
            return 0
        time.sleep(0.3)
    raise CliError(f"the API is not ready after {timeout_s:.0f}s (kiln up, pid {proc.pid}, still runs); see {log_path}")


def stop(home: Path, timeout_s: float) -> int:
    pid = running_pid(home)
    if pid is None:
        console.print(f"{DOWN} kiln is not up on {home}")
        return 0
    console.print(f"{DOWN} stopping kiln up (pid {pid})")
    for attempt, wait_s in enumerate((timeout_s, 15.0)):
        try:
            os.kill(pid, signal.SIGTERM)  # the second one: kill at once, as a second Ctrl-C does
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while running_pid(home) == pid and time.monotonic() < deadline:
            time.sleep(0.2)
        if running_pid(home) != pid:
            break
        if attempt == 0:
            console.print(f"{DOWN} [yellow]still stopping after {timeout_s:.0f}s[/]: killing what is left")
    if running_pid(home) == pid:
        raise CliError(f"kiln up (pid {pid}) did not stop; see {home / 'logs' / DETACHED_LOG}", ExitCode.CONFLICT)
    console.print(f"{DOWN} stopped")
    return 0
