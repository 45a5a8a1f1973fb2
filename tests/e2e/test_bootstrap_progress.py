"""``./kiln``'s first run (scripts/bootstrap) shows its progress while pip installs, on a terminal and off one.

The wrapper runs for real in a copy of the project, with a fresh ``.venv`` and pip installing kiln into it for
real; what would take minutes and the network (the dependencies, torch) is lent to that venv from this checkout's
own ``.venv`` by a ``.pth`` line, as a host's own torch is (``PIP_NO_INDEX=1``: nothing is downloaded, and a
dependency that is not there fails the test instead of fetching the world).
"""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COPIED = [
    "kiln",
    "scripts",
    "pyproject.toml",
    "README.md",
    "api",
    "core",
    "scheduler",
    "workers",
    "trainer",
    "cli",
    "migrations",
    "frontend",
]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A copy of the project whose .venv exists but has nothing installed: the first run's situation."""
    root = tmp_path / "kiln"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "img")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=ignore)
        else:
            shutil.copy2(src, root / name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    venv_site = subprocess.run(
        [str(root / ".venv" / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # This checkout's packages (pip, setuptools, fastapi, torch ...), after the venv's own: kiln itself is installed
    # into the new venv by the bootstrap, which pip does from the copy (it never touches the lent directory).
    Path(venv_site, "lent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root


def _env(root: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "PIP_", "VIRTUAL_ENV"))},
        "KILN_PYTHON": sys.executable,
        "PIP_NO_INDEX": "1",  # offline: everything needed is lent
        # build kiln with the lent setuptools, not one fetched into a fresh env ("0": pip reads this one inverted)
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "HOME": str(root.parent),
        "XDG_CONFIG_HOME": str(root.parent / "xdg"),
    }


def test_first_run_off_a_terminal_prints_a_line_per_step(clone: Path) -> None:
    run = subprocess.run(
        [str(clone / "kiln"), "--help"], cwd=clone, env=_env(clone), capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stderr.splitlines()
    assert lines[0] == f"kiln: preparing {clone / '.venv'} (extras: trainer) ...", lines
    steps = [line for line in lines if line.startswith("kiln: installing (")]
    # each of pip's steps as it happens, with the time so far: at least finding kiln's source, then installing it
    assert any("s): Obtaining file://" in s for s in steps), lines
    assert any("s): Successfully installed kiln-0.1.0" in s for s in steps), lines
    assert lines[-1].startswith(f"kiln: {clone / '.venv'} is ready (") and "pip's log" in lines[-1], lines
    assert "\r" not in run.stderr and "\033[" not in run.stderr  # no terminal redraws in a log
    assert "Successfully installed kiln-0.1.0" in (clone / ".venv" / "pip-install.log").read_text()
    assert run.stdout.strip(), run.stderr  # then the CLI itself ran: ./kiln --help

    again = subprocess.run(
        [str(clone / "kiln"), "--help"], cwd=clone, env=_env(clone), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and again.stderr == "", again.stderr  # installed once: silent after


def test_first_run_on_a_terminal_redraws_one_status_line(clone: Path) -> None:
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [str(clone / "kiln"), "--help"],
        cwd=clone,
        env=_env(clone),
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closed: the wrapper and what it started have ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert proc.wait(timeout=600) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    redraws = text.split("\r\033[K")
    assert any(r.startswith("kiln: installing (") and "s): " in r for r in redraws), text
    assert any("Successfully installed kiln-0.1.0" in r for r in redraws), text  # pip's step, on the status line
    assert "\r\033[Kkiln: " in text and f"kiln: {clone / '.venv'} is ready (" in text, text
