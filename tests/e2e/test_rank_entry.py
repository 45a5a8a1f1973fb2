"""``python -m rank.entry`` as torchrun starts each rank of a worker's attempt: the trainer's own exit code
is recorded for the worker (``RUN_DIR/exit/rank{R}``) and is the process's exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.trainer_protocol import EXIT_DIR, ExitCode

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_trainers_exit_code_is_recorded_and_returned(tmp_path: Path) -> None:
    spec, run_dir = tmp_path / "spec.json", tmp_path / "run"
    spec.write_text('{"name": "x", "steps": -1}')  # a bad spec: the trainer exits USER_ERROR before importing torch
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")} | {"RANK": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "rank.entry", "--spec", str(spec), "--run-dir", str(run_dir)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == ExitCode.USER_ERROR, proc.stderr
    assert (run_dir / EXIT_DIR / "rank0").read_text() == str(int(ExitCode.USER_ERROR))
    assert "kiln trainer: bad spec" in proc.stderr
    assert proc.stderr.rstrip().endswith(f"exit code {int(ExitCode.USER_ERROR)}")  # the rank says how it ended
