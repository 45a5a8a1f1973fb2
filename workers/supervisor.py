"""Launch torchrun for one node of an attempt, signal it, capture its log, and kill its whole tree if needed.

torchrun starts each rank in a session of its own, so a process-group signal does not reach the ranks; the
supervisor therefore remembers every descendant it has seen (psutil, refreshed while it runs) and kills them by
pid when the grace period is over.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from core.private import open_private, private_dir, read_regular
from core.trainer_protocol import ENV_LAUNCHED_AT, EXIT_DIR
from rank.entry import set_parent_death_signal
from workers.isolation import Confinement, preexec


@dataclass(frozen=True)
class Rendezvous:
    """Several nodes meet at ``endpoint`` (host:port); node 0 hosts the c10d store."""

    nnodes: int
    node_rank: int
    endpoint: str
    run_id: str


def launch_command(
    *, nproc_per_node: int, spec_path: Path, run_dir: Path, rendezvous: Rendezvous | None, script: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The command for one node of an attempt, and the environment it adds. One process on one node is the rank
    itself, started directly with the environment torchrun would give it: torchrun's own interpreter and torch
    import add seconds to every start and restart (a restart on the H200 host spent 15.7 s from launch to the
    first telemetry record). Several ranks, or several nodes, go through torchrun. ``script``: each rank runs the
    spec's ``command`` (script mode, ``rank.script``) instead of kiln's trainer."""
    mode = ["--script"] if script else []
    entry = ["-m", "rank.entry", *mode, "--spec", str(spec_path), "--run-dir", str(run_dir)]
    if nproc_per_node == 1 and (rendezvous is None or rendezvous.nnodes == 1):
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}
        return [sys.executable, *entry], env
    return torchrun_command(nproc_per_node=nproc_per_node, rendezvous=rendezvous, entry=entry), {}


def torchrun_command(*, nproc_per_node: int, rendezvous: Rendezvous | None, entry: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node)]
    if rendezvous is None or rendezvous.nnodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += [
            "--nnodes",
            str(rendezvous.nnodes),
            "--node-rank",
            str(rendezvous.node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rendezvous.endpoint,
            "--rdzv-id",
            rendezvous.run_id,
            # Node 0 hosts the store even when the endpoint's name does not match its hostname.
            "--rdzv-conf",
            f"is_host={'true' if rendezvous.node_rank == 0 else 'false'}",
        ]
    cmd += [
        # kiln restarts at the job level (a fresh fencing token, maybe another host), never in place.
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.5",
        *entry,
    ]
    return cmd


# bubblewrap's outer process, its PID namespace's init, and the shim stand above torchrun in a sandbox.
SANDBOX_LEVELS = 3

# If the worker dies (SIGKILL), torchrun gets SIGTERM and forwards it: the ranks checkpoint and stop
# instead of training on, unsupervised, until a newer attempt fences them.
_parent_death_sigterm = functools.partial(set_parent_death_signal, signal.SIGTERM)


class TrainerProcess:
    """One torchrun launcher and the ranks it starts."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        run_dir: Path,
        cwd: Path,
        confinement: Confinement | None = None,
        log_gid: int | None = None,
    ):
        self.argv = argv
        # Sandboxed (workers.sandbox): argv starts bubblewrap, whose two processes and the shim come first in the
        # tree; the descriptors the sandbox inherits; the write end of the shim's lifeline, held while we live.
        self.sandboxed = False
        self.pass_fds: list[int] = []
        self.lifeline: int | None = None
        self.log_gid = log_gid  # the group that may read the log (KILN_STORAGE_GID), else owner-only
        self.log_owner: int | None = None  # the team's uid, which owns its logs (workers.attempt_setup)
        self.confinement = confinement  # the attempt's host memory and process limits (workers/isolation.py)
        self.env = dict(env)
        self.log_path = log_path
        self.run_dir = run_dir
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._tree: dict[int, psutil.Process] = {}
        self.term_sent_at: float | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def log_line(self, message: str) -> None:
        """Supervisor notes interleaved with the trainer's output in the attempt's log."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(self._open_log(), "ab") as f:
            f.write(f"[kiln-worker {stamp}] {message}\n".encode())

    def _open_log(self) -> int:
        """The attempt's log: owner-only (the team's uid where attempts run as one), or readable by the storage group
        only (core/private.py), in a directory of kiln's (no process of the team's may plant a link where the worker
        opens it). Only the worker and the ranks' inherited stdout write it: it is not in the sandbox."""
        private_dir(self.log_path.parent, gid=self.log_gid)
        fd = open_private(self.log_path, gid=self.log_gid)
        if self.log_owner is not None:
            os.fchown(fd, self.log_owner, -1)
        return fd

    def start(self) -> None:
        private_dir(self.run_dir)
        shown = self.argv[self.argv.index("--") + 1 :] if self.sandboxed else self.argv
        self.log_line("launching: " + " ".join(shown) + (" (inside its bubblewrap sandbox)" if self.sandboxed else ""))
        self.env[ENV_LAUNCHED_AT] = repr(time.time())  # where a start's time goes (the trainer's STARTED record)
        self._log = open(self._open_log(), "ab", buffering=0)  # noqa: SIM115 - closed in wait()/close()
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # signals to the worker (Ctrl-C) are not signals to the trainer
                preexec_fn=preexec(self.confinement, _parent_death_sigterm),
                pass_fds=self.pass_fds,
            )
        finally:
            for fd in self.pass_fds:  # the sandbox has its copies (or never will)
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.pass_fds = []
        self._tree = {self._proc.pid: psutil.Process(self._proc.pid)}

    def refresh_tree(self) -> None:
        """Remember every descendant while they are alive; after torchrun dies they cannot be found any more."""
        root = self._tree.get(self.pid)
        if root is None:
            return
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                self._tree.setdefault(child.pid, child)

    def poll(self) -> int | None:
        assert self._proc is not None
        return self._proc.poll()

    def terminate(self) -> None:
        """SIGTERM to torchrun, which forwards it to every rank (each checkpoints, then exits PREEMPTED)."""
        if self.term_sent_at is None:
            self.term_sent_at = time.monotonic()
        self.refresh_tree()
        # torchrun, and the ranks directly: if torchrun is wedged the ranks still get the request. In a sandbox,
        # not bubblewrap (its end would end the sandbox before the ranks checkpoint) nor the shim (it would pass
        # the signal on a second time).
        for proc in self._launched():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)

    def _launched(self) -> list[psutil.Process]:
        """torchrun (or the one rank) and every process under it, without what the sandbox put above them."""
        if not self.sandboxed:
            return list(self._tree.values())
        levels = [[self._tree[self.pid]]] if self.pid in self._tree else []
        for _ in range(SANDBOX_LEVELS):
            below: list[psutil.Process] = []
            for proc in levels[-1] if levels else []:
                with contextlib.suppress(psutil.Error):
                    below += proc.children()
            levels.append(below)
        skipped = {p.pid for level in levels[:SANDBOX_LEVELS] for p in level}
        return [proc for pid, proc in self._tree.items() if pid not in skipped]

    def kill_tree(self) -> None:
        """SIGKILL torchrun and every rank it ever started (psutil checks pid reuse through create time)."""
        self.refresh_tree()
        self.killed = True
        for proc in self._tree.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        assert self._proc is not None
        code = self._proc.wait(timeout)
        self.close()
        if self.sandboxed and 128 < code < 128 + signal.NSIG:
            return 128 - code  # the shim's "killed by signal N" (workers.sandbox_shim), as Popen says it
        return code

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        for fd in [*self.pass_fds, *([self.lifeline] if self.lifeline is not None else [])]:
            with contextlib.suppress(OSError):  # also when the launch failed before the sandbox took its copies
                os.close(fd)
        self.pass_fds, self.lifeline = [], None

    def rank_exit_codes(self) -> dict[int, int]:
        """Exit codes the ranks recorded through ``rank.entry``; killed ranks are missing."""
        codes: dict[int, int] = {}
        exit_dir = self.run_dir / EXIT_DIR
        if not exit_dir.is_dir():
            return codes
        for path in exit_dir.glob("rank*"):
            if path.suffix == ".tmp":
                continue
            with contextlib.suppress(ValueError, OSError):
                codes[int(path.name.removeprefix("rank"))] = int(read_regular(path).decode().strip())
        return codes

    def reap_leftovers(self) -> list[int]:
        """After torchrun exits, kill ranks that are still alive (they must not train unsupervised)."""
        left = []
        for pid, proc in self._tree.items():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    proc.kill()
                    left.append(pid)
        return left
