"""What torchrun starts for each rank: ``python -m trainer`` plus two things torchrun cannot give the worker.

1. The rank's own exit code. torchrun reports any failing rank as its own exit code 1, and the worker needs the
   trainer's code (PREEMPTED, OOM, NCCL_ERROR, ...) to decide the job's next state. Each rank writes its code to
   ``RUN_DIR/exit/rank{R}`` (atomically) on the way out; a rank killed by a signal writes nothing, which the
   worker reads as "killed".
2. A parent-death signal: torchrun starts every rank in its own session, so a rank would outlive a SIGKILLed
   torchrun and keep a GPU busy. With PR_SET_PDEATHSIG the rank receives SIGTERM when torchrun dies: it then
   checkpoints if its fencing token is still current, and exits.

The trainer still runs as ``__main__`` with its own argv, exactly as ``python -m trainer --spec ... --run-dir ...``.
Its stdout and stderr are the rank's own, inherited through torchrun from the worker, which points them at the
attempt's log file (``storage/logs/<job>/<attempt>.log``, streamed by ``kiln logs -f`` and SSE). Each rank also
says there when it starts (stdout) and how it ends (stderr), so the log shows the ranks and not only the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import sys
import time
from pathlib import Path

from core.trainer_protocol import ENV_RANK_STARTED_AT, EXIT_DIR

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)``: this process gets ``sig`` when its parent dies (Linux; else a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _run_dir(argv: list[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--run-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--run-dir="):
            return Path(arg.split("=", 1)[1])
    return None


def _record(run_dir: Path | None, code: int) -> None:
    if run_dir is None:
        return
    rank = os.environ.get("RANK", "0")
    target = run_dir / EXIT_DIR / f"rank{rank}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(str(code))
    os.replace(tmp, target)


def _who() -> str:
    env = os.environ
    return f"[rank {env.get('RANK', '0')}/{env.get('WORLD_SIZE', '1')} local {env.get('LOCAL_RANK', '0')}]"


def _spec_path(argv: list[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--spec" and i + 1 < len(argv):
            return Path(argv[i + 1])
    return None


def script_main(argv: list[str]) -> None:
    """Script mode (``--script``): the spec's command instead of the trainer (``rank.script``). A command
    killed by a signal records no code (the worker reads "killed"), as a killed trainer does."""
    from rank import script

    run_dir, spec_path = _run_dir(argv), _spec_path(argv)
    if run_dir is None or spec_path is None:
        print("usage: python -m rank.entry --script --spec SPEC --run-dir RUN_DIR", file=sys.stderr)
        sys.exit(2)
    code, _, said = script.run(spec_path, run_dir, set_death_signal=set_parent_death_signal)
    if code is not None:
        _record(run_dir, code)
    print(f"{_who()} {said}", file=sys.stderr, flush=True)  # the command's own code, as the timeline says it
    sys.exit(code if code is not None else 128 + int(signal.SIGKILL))


def main() -> None:
    os.environ[ENV_RANK_STARTED_AT] = repr(time.time())  # before the trainer's imports: a start's time is reported
    argv = sys.argv[1:]
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() == 1:  # torchrun already died between fork and prctl
        sys.exit(int(signal.SIGTERM) + 128)
    if argv[:1] == ["--script"]:
        script_main(argv[1:])
        return
    run_dir = _run_dir(argv)
    print(f"{_who()} pid {os.getpid()}: python -m trainer {' '.join(argv)}", flush=True)
    sys.argv = ["trainer", *argv]
    code = 1
    try:
        runpy.run_module("trainer", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            code = 1
    finally:  # also on the way out of an exception the trainer did not catch (Python then prints it, exits 1)
        _record(run_dir, code)
        print(f"{_who()} exit code {code}", file=sys.stderr, flush=True)
    # The trainer returned: what it leaves is on disk (telemetry closed, checkpoints committed, the process group
    # destroyed) and its code recorded. The rank leaves without the interpreter's finalization, where torch's C++
    # threads and static destructors can race the module teardown and abort a rank that finished ("terminate
    # called without an active exception", pytorch#65231; seen once in CI on a resumed 2-rank run), which
    # torchrun would report as that rank's failure.
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
