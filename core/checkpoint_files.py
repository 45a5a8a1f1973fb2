"""A committed checkpoint directory as files: its name, its manifest, its integrity check, its removal.

Pure Python, no torch and no database: the trainer commits checkpoints in this format
(``trainer.checkpoint.store``, which adds the writing side), and the control plane reads it without importing the
trainer (the scheduler's reconciliation of disk and database, ``core.orphan_checkpoints``).

A committed checkpoint is ``step_NNNNNNNN/`` with ``manifest.json`` recording every file's size and sha256, the
step, the writer's fencing token, when it was written (``created``) and the writer's metadata (the step's loss).
Temporary names (``.tmp-*``) are never listed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import uuid
from typing import Any

PREFIX = "step_"
MANIFEST = "manifest.json"


def sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(root: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """Committed checkpoint directories, oldest first (temporary directories are never listed)."""
    out = []
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith(PREFIX):
                with contextlib.suppress(ValueError):
                    out.append((int(p.name[len(PREFIX) :]), p))
    return sorted(out)


def read_manifest(path: pathlib.Path) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path``; raises OSError or ValueError when it cannot be read as one."""
    manifest = json.loads((path / MANIFEST).read_text())
    if not isinstance(manifest, dict):
        raise ValueError(f"{path / MANIFEST} is not a JSON object")
    return manifest


def verify(path: pathlib.Path) -> str | None:
    """None if every file in the manifest is present with its recorded size and sha256, else why not."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest: {exc!r}"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"missing file {name}"
        if f.stat().st_size != meta["bytes"]:
            return f"size mismatch in {name}"
        if sha256_file(f) != meta["sha256"]:
            return f"sha256 mismatch in {name}"
    return None


def remove_checkpoint(path: pathlib.Path) -> None:
    """Delete a committed checkpoint without ever exposing a half-deleted one: rename it out of the listed
    names first (atomic), then delete; a crash in between leaves a ``.tmp-*`` that start-up removes."""
    gone = path.parent / f".tmp-gone-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)
