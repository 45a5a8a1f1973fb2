"""``deterministic: true`` beside the background import of torch's compiler (trainer/compile_preload.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.deps import require_module

pytestmark = pytest.mark.e2e

require_module("torch")

# What the trainer's __main__ and Trainer.__init__ do for a compiled, deterministic job, in a fresh process (imports
# are process-wide: in this one torch's compiler may be loaded already).
SEQUENCE = """
from trainer import compile_preload
compile_preload.start(None)
from trainer.determinism import enable_determinism
print(enable_determinism())
"""


def test_deterministic_kernels_wait_for_the_compiler_preload() -> None:
    """On the H200 every deterministic compiled job crashed at start-up: the main thread's import of Inductor's
    config met the preload thread half way through Dynamo (_DeadlockError, or a circular ImportError on CPU)."""
    proc = subprocess.run([sys.executable, "-c", SEQUENCE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cuBLAS workspace :4096:8" in proc.stdout
