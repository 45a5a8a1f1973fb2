"""The first process of an attempt inside its sandbox: it runs the attempt's command and stops it when the worker
is gone.

    python -m workers.sandbox_shim --lifeline FD -- COMMAND...

Outside a sandbox the trainer learns that its worker died from a parent-death signal (it then checkpoints and
exits). Inside one its parent is bubblewrap, which set the sandbox up as root and cannot signal the team's uid,
so that signal never comes. Instead the worker holds the write end of a pipe whose read end (``FD``) only this
process holds: when the worker dies, the kernel closes it, the read returns, and the shim sends SIGTERM to the
command, as the parent-death signal would have. It also passes on the SIGTERM and SIGINT it receives, and exits
with the command's code (128 + N when a signal N killed it; the worker reads that back as the signal). When it
exits, the sandbox's PID namespace ends and the kernel kills whatever the attempt left behind.

Only the standard library: this runs before every attempt.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from types import FrameType


def watch(fd: int, proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 64):  # the worker never writes: only the end of the pipe returns
            pass
    with contextlib.suppress(ProcessLookupError):
        if proc.poll() is None:
            print("[kiln-sandbox] the worker is gone: asking the attempt to stop", file=sys.stderr, flush=True)
            proc.send_signal(signal.SIGTERM)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--lifeline" or argv[2] != "--":
        print("usage: python -m workers.sandbox_shim --lifeline FD -- COMMAND...", file=sys.stderr)
        return 64
    fd = int(argv[1])
    proc = subprocess.Popen(argv[3:])

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    threading.Thread(target=watch, args=(fd, proc), name="kiln-lifeline", daemon=True).start()
    code = proc.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
