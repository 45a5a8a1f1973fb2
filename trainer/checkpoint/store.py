"""The checkpoint directory's on-disk format and integrity, whatever wrote the state in it.

A checkpoint is committed in one protocol: its files are written under ``.tmp-step_N-*`` (a name never
listed), each is fsynced, ``manifest.json`` records every file's size and sha256 (plus the step, the writer's
fencing token and the writer's metadata), and the directory is renamed to ``step_N`` - but only while the
writer's lease is valid and the fence file still names its token (``core.fence``), so an attempt that lost its
lease never commits state.  A listed
checkpoint is therefore complete or it is not there; ``verify`` re-hashes it against its manifest to catch
what changed on disk since.  Removal renames out of the listed names first, for the same reason.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time
from collections.abc import Callable
from typing import Any

from core.checkpoint_files import (
    MANIFEST,
    PREFIX,
    list_checkpoints,
    remove_checkpoint,
    sha256_file,
    step_dir_name,
    verify,
)
from core.fence import fence_names

# The read side is core's (the control plane reads checkpoints without importing the trainer); named here too, so
# the trainer's modules keep one place to import the format from.
__all__ = [
    "MANIFEST",
    "PREFIX",
    "EXTRA",
    "FencedError",
    "list_checkpoints",
    "remove_checkpoint",
    "sha256_file",
    "step_dir_name",
    "verify",
    "write_manifest_and_commit",
]

EXTRA = "extra.pt"


class FencedError(RuntimeError):
    """The fence file names another attempt: this one may no longer commit state (-> ExitCode.FENCED)."""


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest_and_commit(
    tmp: pathlib.Path,
    final: pathlib.Path,
    *,
    step: int,
    token: int | None,
    meta: dict[str, Any],
    written: dict[str, tuple[int, str]] | None = None,
    fence_root: pathlib.Path | None = None,
    lease: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``written``: files the caller already fsynced and hashed while writing them (name -> bytes, sha256);
    every other file under ``tmp`` is fsynced and hashed here.  ``fence_root``: the directory holding the
    fence file (the durable job dir; default ``final``'s parent) - a local-tier commit obeys it too.
    ``lease``: called just before the fence check and the rename (``trainer.lease.LeaseGuard.ensure``); it
    returns only while this attempt holds its lease, and raises ``FencedError`` when it may no longer commit."""
    files = {}
    for f in sorted(tmp.rglob("*")):
        if f.is_file():
            name = f.relative_to(tmp).as_posix()
            if written and name in written:
                files[name] = {"bytes": written[name][0], "sha256": written[name][1]}
                continue
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
            files[name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    manifest = {"step": step, "fencing_token": token, "created": time.time(), "files": files, **meta}
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    try:
        if lease is not None:
            lease(f"commit of step {step}")
        if not fence_names(fence_root or final.parent, token):
            raise FencedError(f"fence no longer names token {token}; checkpoint at step {step} not committed")
    except FencedError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # a rolled-back run re-reaching a step: the new state replaces the old
        remove_checkpoint(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    return manifest
