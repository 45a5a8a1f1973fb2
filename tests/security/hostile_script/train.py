"""A script (script mode) that tries what a team's code must not do, run as its team's own user by the tests in
tests/security/test_script_isolation.py: `python train.py daemon` leaves a daemon behind, then trains and commits
a checkpoint through kiln's client; `python train.py read PATH` reads a file of another team's."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from trainer import script_client as kiln


def daemon() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            (Path(os.environ["TMPDIR"]) / "daemon.pid").write_text(str(os.getpid()))
            while True:
                time.sleep(1)
        os._exit(0)
    time.sleep(0.5)
    print(f"uid {os.getuid()} gid {os.getgid()}", flush=True)
    for step in range(1, kiln.steps() + 1):
        kiln.report(step, 1.0 / step)
    with kiln.checkpoint(kiln.steps(), loss=1.0 / kiln.steps()) as d:
        (d / "state.txt").write_text("mine")


def read(path: str) -> None:
    print(Path(path).read_bytes()[:16])


if __name__ == "__main__":
    {"daemon": lambda: daemon(), "read": lambda: read(sys.argv[2])}[sys.argv[1]]()
