"""Script mode (spec ``command:``): what each rank runs instead of kiln's trainer.

``python -m rank.entry --script --spec SPEC --run-dir RUN_DIR`` (started by torchrun, one per GPU or CPU
slot, or directly for one process) runs the spec's command from the job's unpacked code directory with torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``) and kiln's (the fencing token, the
checkpoint directory, the lease, ``KILN_RUN_DIR``, ``KILN_SEED``, ``KILN_STEPS``), and turns how it ended into the
rank's exit code, which the worker classifies (``workers.exit_classes``):

- 0: succeeded;
- a code kiln's client chose (``trainer.script_client``: FENCED, LEASE_EXPIRED, PREEMPTED, STORAGE_ERROR), read
  from the intent file it wrote just before it exited with that code;
- killed by a signal (directly, or through a shell: 128 + N), which the script did not cause (the worker's stop,
  the host's OOM killer, a lost host): no code is recorded, and the worker reads "killed": an infrastructure
  failure, restarted from the last verified checkpoint (or what the worker asked for);
- an exit whose last stderr line is an out-of-memory error or a collective's (NCCL, gloo, the store) failure: OOM
  or NCCL_ERROR, what the host or a link caused;
- any other non-zero exit: USER_ERROR, with the last line the script wrote to stderr (a Python traceback's
  exception line) as the job's reason. The job fails, with no restart.

The command's stdout goes to the attempt's log as it is; its stderr is copied there line by line.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import IO, Any

from core.telemetry import Telemetry
from core.trainer_protocol import (
    ENV_CODE_DIR,
    ENV_KEEP_LAST,
    ENV_RUN_DIR,
    ENV_SEED,
    ENV_STEPS,
    EXIT_DIR,
    SCRIPT_INTENT_PREFIX,
    ExitCode,
    RecordKind,
)

KILN_ROOT = pathlib.Path(__file__).resolve().parent.parent  # the directory holding kiln's packages
PYTHON_NAMES = ("python", "python3")  # run with kiln's interpreter: the one with torch and the client
MAX_LINE = 440
# A last stderr line that names what a host, a device or a link caused, not the script.
OOM_MARKERS = ("MemoryError", "OutOfMemoryError", "CUDA out of memory")
COLLECTIVE_MARKERS = ("DistBackendError", "DistNetworkError", "DistStoreError", "gloo/transport", "NCCL error")
INTENDED = {ExitCode.FENCED, ExitCode.LEASE_EXPIRED, ExitCode.PREEMPTED, ExitCode.STORAGE_ERROR}


def command_of(spec: dict[str, Any]) -> list[str]:
    command = [str(a) for a in spec.get("command") or []]
    if command and command[0] in PYTHON_NAMES:
        command[0] = sys.executable
    return command


def script_env(spec: dict[str, Any], run_dir: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_SEED] = str(int(spec.get("seed") or 0))
    env[ENV_STEPS] = str(int(spec.get("steps") or 100))
    env[ENV_KEEP_LAST] = str(int((spec.get("checkpointing") or {}).get("keep_last") or 3))
    # kiln's packages after the script's own directory: `from trainer import script_client` works from any script
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(KILN_ROOT)])
    return env


def intended_code(run_dir: pathlib.Path, rank: str) -> int | None:
    """The code kiln's client made the script exit with, if it did."""
    with contextlib.suppress(OSError, ValueError):
        return int((run_dir / EXIT_DIR / f"{SCRIPT_INTENT_PREFIX}{rank}").read_text().strip())
    return None


def classify_exit(returncode: int, last_line: str | None, intended: int | None) -> tuple[int | None, str | None]:
    """(the rank's exit code to record, or None for "killed"; the user's error line for USER_ERROR)."""
    if returncode == 0:
        return int(ExitCode.SUCCEEDED), None
    if returncode < 0:
        return None, None
    if intended is not None and returncode == intended and intended in INTENDED:
        return intended, None
    if returncode > 128:
        with contextlib.suppress(ValueError):
            signal.Signals(returncode - 128)
            return None, None
    line = (last_line or "").strip()
    if any(m in line for m in OOM_MARKERS):
        return int(ExitCode.OOM), None
    if any(m in line for m in COLLECTIVE_MARKERS):
        return int(ExitCode.NCCL_ERROR), None
    if line:
        return int(ExitCode.USER_ERROR), f"{line[:MAX_LINE]} (exit code {returncode})"
    return int(ExitCode.USER_ERROR), f"the command exited with code {returncode} and wrote nothing to stderr"


class _StderrTee:
    """Copy the command's stderr to ours (the attempt's log), remembering its last non-empty line."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.last: str | None = None
        self.thread = threading.Thread(target=self._run, name="kiln-script-stderr", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        out = sys.stderr.buffer
        for raw in iter(self.stream.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                out.write(raw)
                out.flush()
            text = raw.decode(errors="replace").strip()
            if text:
                self.last = text

    def join(self) -> None:
        self.thread.join(timeout=10.0)


def ended(returncode: int, code: int | None) -> str:
    """How the command ended, as both the timeline's EXIT event and the attempt's log say it: the command's own exit
    code, then what kiln makes of it (``code``, the rank's code). The log said the rank's code alone, so a script
    that exited 1 read "exited with 1" in the timeline and "exit code 2" (USER_ERROR) in the log."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"the command was killed by {signal.Signals(-returncode).name} ({_reason(code)})"
    return f"the command exited with {returncode} ({_reason(code)})"


def _reason(code: int | None) -> str:
    try:
        return ExitCode(code).name if code is not None else "KILLED"
    except ValueError:
        return "CRASH"


def run(spec_path: pathlib.Path, run_dir: pathlib.Path, *, set_death_signal: Any) -> tuple[int | None, str | None, str]:
    """Run the spec's command to its end; (the rank's code or None for "killed", the user's error line, how the
    command ended in words: ``ended``)."""
    rank = os.environ.get("RANK", "0")
    spec = json.loads(spec_path.read_text())
    command = command_of(spec)
    code_dir = pathlib.Path(os.environ.get(ENV_CODE_DIR) or run_dir / "code")
    tel = Telemetry(run_dir, int(rank))
    print(f"[rank {rank}] running {json.dumps(command)} in {code_dir}", flush=True)
    proc = subprocess.Popen(
        command,
        cwd=code_dir,
        env=script_env(spec, run_dir),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: set_death_signal(signal.SIGKILL),
    )

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    assert proc.stderr is not None
    tee = _StderrTee(proc.stderr)
    returncode = proc.wait()
    tee.join()
    code, error = classify_exit(returncode, tee.last, intended_code(run_dir, rank))
    said = ended(returncode, code)
    if code == ExitCode.SUCCEEDED and rank == "0":
        # The job's result comes from rank 0's node (a gang's other nodes wait for it, workers.runner); a script's
        # progress and loss are what it reported, so the record carries no step of its own.
        tel.emit(RecordKind.DONE, steps=None, final_loss=None, exit_code=0, source="script", eval=None)
    reason = _reason(code)
    tel.event(
        "EXIT", said, exit_code=code if code is not None else 1, reason=reason, error=error, returncode=returncode
    )
    tel.close()
    if error:
        print(f"kiln: your command failed: {error}", file=sys.stderr, flush=True)
    return code, error, said
