"""The worker's supervision of the host's MPS daemon, against a stand-in for the binary (no GPU here; the real
``nvidia-cuda-mps-control`` runs under the same code on the GPU host)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.mps import MpsDaemon

pytestmark = pytest.mark.e2e

STANDIN = str(Path(__file__).resolve().parents[1] / "support" / "mps_standin.py")


def daemon_pid(d: MpsDaemon) -> int:
    return int((d.pipe_dir / "standin-daemon.pid").read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[MpsDaemon]:
    d = MpsDaemon.find("auto", STANDIN, tmp_path / "mps")
    assert d is not None
    yield d
    d.stop()


def test_started_in_the_workers_own_directories_and_healthy(daemon: MpsDaemon, tmp_path: Path) -> None:
    assert daemon.start()
    assert (daemon.state, daemon.generation) == ("running", 1)
    assert daemon.healthy()
    assert daemon.client_env() == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / "log"),
    }
    assert oct(daemon.pipe_dir.stat().st_mode & 0o777) == "0o700"
    assert not daemon.ensure()  # alive: nothing to do


def test_a_dead_daemon_is_started_again_with_a_new_generation(daemon: MpsDaemon) -> None:
    assert daemon.start()
    first = daemon_pid(daemon)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while daemon.healthy() and time.monotonic() < deadline:  # the kill lands asynchronously
        time.sleep(0.05)
    assert daemon.ensure()  # it had died: restarted, and its clients must go
    assert (daemon.state, daemon.generation) == ("running", 2)
    assert daemon_pid(daemon) != first and daemon.healthy()


def test_stop_ends_the_daemon(daemon: MpsDaemon) -> None:
    assert daemon.start()
    pid = daemon_pid(daemon)
    daemon.stop()
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.state == "stopped" and not daemon.healthy()


def test_no_daemon_where_mps_is_off_or_not_installed(tmp_path: Path) -> None:
    assert MpsDaemon.find("off", STANDIN, tmp_path) is None
    assert MpsDaemon.find("auto", "no-such-mps-control-binary", tmp_path) is None


def test_a_daemon_that_does_not_start_is_reported_failed(tmp_path: Path) -> None:
    d = MpsDaemon.find("auto", "false", tmp_path)  # /usr/bin/false: exits 1 whatever it is asked
    assert d is not None
    assert not d.start()
    assert d.state == "failed" and d.last_error is not None and "exit 1" in d.last_error


def test_for_team_users_the_pipes_are_reachable_and_not_listable(daemon: MpsDaemon, tmp_path: Path) -> None:
    """Attempts run as their teams' users (workers/attempt_user.py) and MPS starts a server as each client's user:
    they must reach the pipes (0711 down to them, the daemon's files created under umask 022) and write the
    server logs (1733), and list neither. Before, both were the worker's 0700: no team's client could connect."""
    daemon.for_team_users = True
    assert daemon.start() and daemon.healthy()
    modes = {p: oct(p.stat().st_mode & 0o7777) for p in (tmp_path / "mps", daemon.pipe_dir, daemon.log_dir)}
    assert modes == {tmp_path / "mps": "0o711", daemon.pipe_dir: "0o711", daemon.log_dir: "0o1733"}
    assert oct((daemon.pipe_dir / "standin-daemon.pid").stat().st_mode & 0o777) == "0o644"  # umask 022
