"""A private ``redis-server`` on a port of its own, for the tests that crash the broker.

The shared Redis (127.0.0.1:6379) serves every other test on the machine; a test that kills its broker kills
this one instead: SIGKILL (what a crash or the OOM killer does: no shutdown, the connections reset) or a clean
``SHUTDOWN NOSAVE``, and starts it again on the same port, empty, as a restarted Redis without persistence is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from harness.workers_cluster import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def alive(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url(), socket_connect_timeout=1).ping())
        except redis.exceptions.ConnectionError:
            return False

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=open(self.workdir / "redis.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        wait_for(self.alive, 15, f"the private Redis on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, with every message and every unacknowledged delivery in it."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def shutdown(self) -> None:
        """A clean stop that keeps nothing (``SHUTDOWN NOSAVE``)."""
        assert self.proc is not None
        with contextlib.suppress(redis.exceptions.ConnectionError):
            redis.Redis.from_url(self.url()).shutdown(nosave=True)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def private_redis(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
