"""What importing the CLI loads, in a fresh interpreter: no torch, httpx or SQLAlchemy (a command's start stays
cheap, and the CLI runs where none of them is installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_cli_import_loads_no_torch_httpx_or_sqlalchemy() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import cli.main; "
        "print(time.perf_counter() - t); "
        "print(int(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))); "
        "print(int('httpx' in sys.modules)); print(int('sqlalchemy' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    seconds, torch, httpx, sqlalchemy = out.stdout.split()
    assert (torch, httpx, sqlalchemy) == ("0", "0", "0")
