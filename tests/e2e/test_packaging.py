"""The wheel a GPU host or a control-plane host installs (``pip install kiln[trainer]``) holds everything kiln
reads at run time besides Python: the migrations and the dashboard's static files. Built from this checkout,
installed into a folder of its own, and run from there, away from the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_migrations_and_dashboard_and_runs_installed(tmp_path: Path) -> None:
    # Built from a copy of the tracked files: setuptools writes build/ and *.egg-info beside the sources.
    src = tmp_path / "src"
    tracked_files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in tracked_files.stdout.splitlines():
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"

    def pip(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pip", *args, "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr

    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src))
    (wheel,) = dist.glob("kiln-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "frontend", "migrations"], cwd=ROOT, capture_output=True, text=True)
    wanted = {n for n in tracked.stdout.split() if not n.endswith(".md")}
    assert wanted and wanted <= names, sorted(wanted - names)

    target = tmp_path / "site"
    pip("install", "--no-deps", "--no-index", "--target", str(target), str(wheel))
    probe = (
        "import api.routers.dashboard.common as c, core.migrate as m; "
        "assert (c.FRONTEND_DIR / 'index.html').is_file(), c.FRONTEND_DIR; "
        "m.upgrade('sqlite:///installed.db'); print(c.FRONTEND_DIR)"
    )
    env = {**os.environ, "PYTHONPATH": str(target), "KILN_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()).is_relative_to(target)  # the installed copy, not the checkout
    assert (tmp_path / "installed.db").stat().st_size > 0
