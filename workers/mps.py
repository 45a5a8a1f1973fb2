"""The host's MPS control daemon: started, watched and restarted by the worker, for fractional jobs.

Fractional jobs (``resources.gpu_share``) share a GPU through NVIDIA MPS: each attempt is an MPS client whose SM
share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) and pinned memory limit (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) the
MPS server enforces. One control daemon serves the whole host; its pipe and log directories are the worker's own
(under the storage directory, per host), so it never meets a daemon someone else started in /tmp/nvidia-mps.

Health is the control daemon answering ``get_server_list`` on its pipe. A daemon found dead is started again and
its *generation* goes up: every attempt that was a client of an older generation lost its MPS server with it, so
the worker stops it as an infrastructure failure and the job restarts from its last verified checkpoint.

Without the binary (or with ``KILN_MPS=off``) the host runs no daemon and the scheduler places no share on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

from core.states import MpsState

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 5.0


class MpsDaemon:
    def __init__(self, control: str, root: Path) -> None:
        self.control = control
        self.root = root
        # Attempts run as their teams' users (workers/isolation.py): MPS starts a server as each client's user,
        # so the pipe directory must be enterable and the daemon's pipes and logs open to them.
        self.for_team_users = False
        self.pipe_dir = root / "pipe"
        self.log_dir = root / "log"
        self.generation = 0  # goes up on every (re)start; attempts remember the one they started under
        self.state = MpsState.STOPPED
        self.last_error: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def find(cls, mode: str, control: str, root: Path) -> MpsDaemon | None:
        """The host's daemon where MPS is wanted and installed, else None (said at start-up by the worker)."""
        if mode == "off":
            return None
        path = shutil.which(control)
        return cls(path, root) if path else None

    def client_env(self) -> dict[str, str]:
        """What makes a process this daemon's client (and where the server writes its logs)."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.client_env()}
        umask = 0o022 if self.for_team_users else -1  # -1: the worker's (077)
        return subprocess.run(
            [self.control, *args],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=HEALTH_TIMEOUT_S,
            umask=umask,
        )

    def healthy(self) -> bool:
        try:
            return self._run([], stdin="get_server_list\n").returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def start(self) -> bool:
        """Start the daemon (``-d`` forks it into the background); True once it answers."""
        with self._lock:
            self.pipe_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self.for_team_users:  # enterable, not listable, from the storage directory's mps/ down to the pipes
                for d in (self.root.parent, self.root, self.pipe_dir):
                    os.chmod(d, 0o711)
                os.chmod(self.log_dir, 0o1733)  # servers of every team's user write their logs; none lists them
            try:
                started = self._run(["-d"])
            except (OSError, subprocess.TimeoutExpired) as exc:
                return self._failed(repr(exc))
            if started.returncode != 0 or not self.healthy():
                return self._failed(f"exit {started.returncode}: {(started.stderr or started.stdout).strip()[:200]}")
            self.generation += 1
            self.state = MpsState.RUNNING
            self.last_error = None
            return True

    def _failed(self, why: str) -> bool:
        self.state = MpsState.FAILED
        self.last_error = why
        log.warning("MPS control daemon did not start: %s", why)
        return False

    def ensure(self) -> bool:
        """Called by the host agent on each heartbeat: True if the daemon had died and was started again."""
        if self.state == MpsState.RUNNING and self.healthy():
            return False
        was_running = self.state == MpsState.RUNNING
        self.state = MpsState.RESTARTING
        log.warning("MPS control daemon %s; starting it again", "died" if was_running else "is not running")
        return self.start() and was_running

    def stop(self) -> None:
        """Ask the daemon to quit (it ends its servers once their clients are gone)."""
        with self._lock:
            if self.state == MpsState.RUNNING:
                try:
                    self._run([], stdin="quit\n")
                except (OSError, subprocess.TimeoutExpired) as exc:
                    log.warning("MPS control daemon did not quit: %r", exc)
            self.state = MpsState.STOPPED


# The worker process's daemon (None: this host offers no shares); set once by the worker at start-up.
DAEMON: MpsDaemon | None = None


def configure(mode: str, control: str, root: Path, *, for_team_users: bool = False) -> MpsDaemon | None:
    global DAEMON
    DAEMON = MpsDaemon.find(mode, control, root)
    if DAEMON is not None:
        DAEMON.for_team_users = for_team_users
        DAEMON.start()
    return DAEMON
