"""``kiln submit --workdir DIR`` and ``--check``: the team's own code, packed, checked and uploaded once.

The CLI never imports torch: ``--check`` runs ``python -m trainer.check`` in a child process when torch is
installed, and says what it could not check when it is not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cli.errors import CliError, ExitCode
from cli.output import err_console
from cli.output import text as safe_text
from core.code_archive import ArchiveError, pack_bytes


def with_code(text: str, path: str) -> dict[str, Any]:
    """The spec as a mapping, checked to have a ``code`` section (``--workdir`` uploads what it names)."""
    data = yaml.safe_load(text)
    if isinstance(data, dict) and data.get("command") is not None and data.get("code") is None:
        data["code"] = {}  # script mode: the command runs from the uploaded directory, whose digest goes here
    if not isinstance(data, dict) or not isinstance(data.get("code"), dict):
        raise CliError(
            f"{path}: --workdir needs a `code:` section naming the entry point "
            "(code: {entry_point: MODULE}) or a `command:` (docs/user-code.md)",
            ExitCode.INVALID,
        )
    return data


def upload(api: Any, data: dict[str, Any], workdir: Path) -> str:
    """Pack ``workdir``, upload it unless the team has it already, and put its digest into the spec."""
    try:
        blob, summary = pack_bytes(workdir)
    except (ArchiveError, OSError) as exc:
        raise CliError(f"cannot pack {workdir}: {exc}", ExitCode.INVALID) from None
    digest = hashlib.sha256(blob).hexdigest()
    team = data.get("team")
    path = f"/v1/teams/{team}/artifacts/{digest}"
    try:
        api.get(path)
        sent = 0
    except CliError as exc:
        if exc.code is not ExitCode.NOT_FOUND:
            raise
        api.request("PUT", path, content=blob, headers={"Content-Type": "application/gzip"})
        sent = len(blob)
    what = "already uploaded, 0 bytes sent" if sent == 0 else f"uploaded {sent} bytes"
    err_console.print(
        safe_text(
            f"code {digest[:12]} ({summary.entries} files and directories, {summary.unpacked_bytes} bytes): {what}"
        )
    )
    data["code"]["digest"] = digest
    return digest


def can_check(data: dict[str, Any] | None) -> bool:
    """Whether this client can read the hyperparameters of the team's own code before it uploads it: a spec with an
    entry point (script mode has none to read), its directory at hand and torch installed here."""
    code = (data or {}).get("code")
    return isinstance(code, dict) and bool(code.get("entry_point")) and _has_trainer()


def _has_trainer() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("trainer") is not None


def check(specs: list[dict[str, Any]], workdir: Path | None, *, run_model: bool = True) -> None:
    """Every spec's hyperparameters read (a sweep's jobs: each one's settings) and one forward and backward step of
    the first one's model on the CPU, in a child process (torch stays out of the CLI); with ``run_model`` false the
    hyperparameters only. Without torch, says what was not checked."""
    if not _has_trainer():
        err_console.print(
            "check: spec and hyperparameters valid; torch is not installed here, so the model was not "
            "run (pip install 'kiln[trainer]')"
        )
        return
    with tempfile.TemporaryDirectory(prefix="kiln-check-") as tmp:
        argv = [sys.executable, "-m", "trainer.check"]
        for i, spec in enumerate(specs):
            spec_path = Path(tmp) / f"spec{i}.json"
            spec_path.write_text(json.dumps(spec))
            argv += ["--spec", str(spec_path)]
        if workdir is not None:
            argv += ["--code", str(workdir)]
        if not run_model:
            argv.append("--hyperparameters-only")
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    line = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        reason = line or (proc.stderr.strip().splitlines() or ["the check crashed"])[-1]
        raise CliError(f"check failed: {reason.removeprefix('check: ')}", ExitCode.INVALID)
    err_console.print(safe_text(line))
