"""The e2e harness never signals a process by the pid of a worker it has already reaped: pids wrap around within a
CI run (pid_max 32768 here, threads count), and such a pid can be another test's worker by then, whose trainer a
"kill what the worker left behind" would kill (a CI run lost a frozen trainer's exit that way, or so it looked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.workers_cluster import Cluster

pytestmark = pytest.mark.e2e


def test_a_reaped_workers_pid_is_never_looked_up_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path, database_url="sqlite://", broker_url="memory://")
    Cluster.of_this_test.remove(c)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # exited and reaped: its pid is free for anyone now
    c.workers["gone"] = done
    looked_up: list[int] = []
    real = psutil.Process

    def spy(pid: int | None = None) -> Any:
        looked_up.append(pid if pid is not None else -1)
        return real(pid)

    monkeypatch.setattr(psutil, "Process", spy)
    assert c.trainer_pids("gone") == [] and c.freeze_worker("gone") == [] and c.kill_worker("gone") == []
    c.stop_all()
    assert done.pid not in looked_up
