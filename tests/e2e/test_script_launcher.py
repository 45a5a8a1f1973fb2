"""Script mode as real processes: the client a script imports, run by a plain interpreter outside kiln; how a
script's end becomes a rank's exit code (``python -m rank.entry --script`` running real commands); and the launcher
the worker builds for two CPU slots (torchrun, two ranks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.fence import Lease, lease_clock, write_fence, write_lease
from core.trainer_protocol import (
    ENV_CHECKPOINT_DIR,
    ENV_CODE_DIR,
    ENV_FENCING_TOKEN,
    ENV_LEASE_FILE,
    EXIT_DIR,
    TELEMETRY_DIR,
    ExitCode,
)
from tests.unit.test_script_mode import records
from trainer.checkpoint.store import list_checkpoints

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_imports_no_torch_and_works_outside_kiln(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom trainer import script_client as kiln\n"
        "kiln.report(1, 0.5)\n"
        "with kiln.checkpoint(1) as d:\n    (d / 'x').write_text('x')\n"
        "print(kiln.latest_checkpoint().step, 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["1", "False"]
    assert (tmp_path / "kiln-checkpoints" / "step_00000001" / "x").is_file()


def launch(tmp_path: Path, script: str, *, term_after: bool = False) -> tuple[int, Path]:
    """``python -m rank.entry --script`` as the worker launches one rank, on a real command."""
    code, run_dir, ckpt = tmp_path / "code", tmp_path / "run", tmp_path / "ckpt"
    code.mkdir()
    run_dir.mkdir()
    (code / "train.py").write_text(script)
    (run_dir / "spec.json").write_text(json.dumps({"command": ["python", "train.py"], "steps": 3, "seed": 1}))
    write_fence(ckpt, 3)
    write_lease(run_dir / "lease", Lease.renewed(token=3, at=lease_clock(), lease_s=600))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env |= {
        ENV_CODE_DIR: str(code),
        ENV_CHECKPOINT_DIR: str(ckpt),
        ENV_FENCING_TOKEN: "3",
        ENV_LEASE_FILE: str(run_dir / "lease"),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        sys.executable,
        "-m",
        "rank.entry",
        "--script",
        "--spec",
        str(run_dir / "spec.json"),
        "--run-dir",
        str(run_dir),
    ]
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if term_after:
        assert proc.stdout is not None
        for line in proc.stdout:  # the script says when it is ready to be signalled
            if "ready" in line:
                break
        proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    (tmp_path / "output").write_text(output)
    return proc.returncode, run_dir


def exit_record(run_dir: Path) -> dict[str, object]:
    events = [r for r in records(run_dir) if r.get("type") == "EXIT"]
    assert len(events) == 1
    return events[0]["fields"]  # type: ignore[return-value]


def test_a_script_that_raises_is_the_users_error_with_its_exception_line(tmp_path: Path) -> None:
    rc, run_dir = launch(tmp_path, "import sys\nprint('hello')\nraise ValueError('lr must be positive, got -1')\n")
    assert rc == ExitCode.USER_ERROR
    assert (run_dir / EXIT_DIR / "rank0").read_text() == "2"
    assert exit_record(run_dir)["error"] == "ValueError: lr must be positive, got -1 (exit code 1)"
    # The timeline's EXIT event and the attempt's log say the command's own code alike (the log said "exit code 2").
    said = "the command exited with 1 (USER_ERROR)"
    assert [r["message"] for r in records(run_dir) if r.get("type") == "EXIT"] == [said]
    assert (tmp_path / "output").read_text().rstrip().endswith(f"[rank 0/1 local 0] {said}")


def test_a_script_reports_steps_and_succeeds(tmp_path: Path) -> None:
    script = (
        "from trainer import script_client as kiln\n"
        "import os\nassert os.getcwd().endswith('code')\n"
        "for s in range(1, kiln.steps() + 1):\n    kiln.report(s, 1.0 / s)\n"
        "with kiln.checkpoint(kiln.steps()) as d:\n    (d / 'w').write_text('w')\n"
    )
    rc, run_dir = launch(tmp_path, script)
    assert rc == 0 and (run_dir / EXIT_DIR / "rank0").read_text() == "0"
    steps = [r["step"] for r in records(run_dir) if r["kind"] == "step"]
    assert steps == [1, 2, 3]
    # rank 0's end is the job's result (a gang's other nodes leave the report to the node that ran rank 0)
    assert [r["steps"] for r in records(run_dir) if r["kind"] == "done"] == [None]
    assert list_checkpoints(tmp_path / "ckpt")[0][0] == 3


def test_a_script_killed_by_a_signal_records_no_code(tmp_path: Path) -> None:
    rc, run_dir = launch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert rc != 0 and not (run_dir / EXIT_DIR / "rank0").exists()  # the worker reads "killed": infrastructure


def test_sigterm_reaches_the_script_which_checkpoints_and_exits_preempted(tmp_path: Path) -> None:
    script = (
        "import time\nfrom trainer import script_client as kiln\n"
        "kiln.should_stop()\nprint('ready', flush=True)\n"
        "while not kiln.should_stop():\n    time.sleep(0.05)\n"
        "with kiln.checkpoint(1) as d:\n    (d / 'w').write_text('w')\n"
        "kiln.exit_stopped()\n"
    )
    rc, run_dir = launch(tmp_path, script, term_after=True)
    assert rc == ExitCode.PREEMPTED and (run_dir / EXIT_DIR / "rank0").read_text() == str(int(ExitCode.PREEMPTED))
    assert [s for s, _ in list_checkpoints(tmp_path / "ckpt")] == [1]


def test_two_cpu_processes_run_the_example_under_torchrun(tmp_path: Path) -> None:
    """The launcher the worker builds for two CPU slots: torchrun, two ranks of the example script (DDP over
    gloo), rank 0 commits, both report, both exit 0."""
    from workers.supervisor import launch_command

    code, run_dir, ckpt = ROOT / "examples" / "digits-script", tmp_path / "run", tmp_path / "ckpt"
    run_dir.mkdir()
    spec = {"command": ["python", "train.py", "--every", "5"], "steps": 10, "seed": 3, "checkpointing": {}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    write_fence(ckpt, 4)
    write_lease(run_dir / "lease", Lease.renewed(token=4, at=lease_clock(), lease_s=600))
    argv, extra = launch_command(
        nproc_per_node=2, spec_path=run_dir / "spec.json", run_dir=run_dir, rendezvous=None, script=True
    )
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--script" in argv and extra == {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env |= {
        ENV_CODE_DIR: str(code),
        ENV_CHECKPOINT_DIR: str(ckpt),
        ENV_FENCING_TOKEN: "4",
        ENV_LEASE_FILE: str(run_dir / "lease"),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(argv, env=env, cwd=run_dir, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {p.name: p.read_text() for p in (run_dir / EXIT_DIR).glob("rank*")} == {"rank0": "0", "rank1": "0"}
    for rank in (0, 1):
        lines = (run_dir / TELEMETRY_DIR / f"rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines if json.loads(x)["kind"] == "step"] == list(range(1, 11))
    assert [s for s, _ in list_checkpoints(ckpt)] == [5, 10]
