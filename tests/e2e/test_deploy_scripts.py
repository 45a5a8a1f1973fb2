"""The deployment's scripts run for real: ``scripts/pyproject_deps.py`` prints an extra's requirements, and the
worker container's ``sh -c`` command refuses to start without its address."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.unit.test_deploy_files import ROOT, SERVICES

pytestmark = pytest.mark.e2e


def test_pyproject_deps_prints_the_declared_requirements_and_refuses_an_unknown_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    script = [sys.executable, str(ROOT / "scripts" / "pyproject_deps.py")]
    out = subprocess.run([*script, "trainer"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == project["dependencies"] + project["optional-dependencies"]["trainer"]
    bad = subprocess.run([*script, "gpu"], capture_output=True, text=True)
    assert bad.returncode == 1 and "no extra gpu" in bad.stderr


def worker_command(**environ: str) -> subprocess.CompletedProcess[str]:
    """The worker's real ``sh -c`` command, run by sh, with ``python`` replaced by a printer of its arguments."""
    shell, flag, script = SERVICES["worker-gpu"]["command"]
    script = script.replace("$$", "$").replace("exec python", "exec printf '%s\\n' python")
    return subprocess.run([shell, flag, script], capture_output=True, text=True, env=environ)


def test_the_worker_command_requires_its_address_and_passes_it_on() -> None:
    missing = worker_command(PATH="/usr/bin:/bin")
    assert missing.returncode != 0 and "set KILN_WORKER_ADDRESS" in missing.stderr
    ok = worker_command(PATH="/usr/bin:/bin", KILN_WORKER_ADDRESS="10.1.2.3")
    assert ok.stdout.splitlines() == ["python", "-m", "workers", "--address", "10.1.2.3"]
