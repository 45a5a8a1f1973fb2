"""Files that hold secrets or a team's work are kiln's alone: owner-only modes (0600 files, 0700 directories).

Where the API and the workers run as different users on a shared volume (``docker-compose.yml``: the API as
``kiln``, the worker as root), the API must still read the attempt logs a worker writes: ``KILN_STORAGE_GID``
names the one group that may read them (0640 files, 0750 directories, that group); still nobody else.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

FILE_MODE, DIR_MODE = 0o600, 0o700
GROUP_FILE_MODE, GROUP_DIR_MODE = 0o640, 0o750


def private_dir(path: Path, *, gid: int | None = None) -> Path:
    """``path`` (and missing parents) as a directory only kiln (and ``gid``, to read) may enter."""
    path.mkdir(parents=True, exist_ok=True)
    _restrict(path, GROUP_DIR_MODE if gid is not None else DIR_MODE, gid)
    return path


def open_private(path: Path, *, gid: int | None = None) -> int:
    """A file descriptor appending to ``path``, created (or narrowed) to owner-only, or group-readable by ``gid``."""
    mode = GROUP_FILE_MODE if gid is not None else FILE_MODE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    with contextlib.suppress(PermissionError):  # not ours to change (another user's file): leave it as it is
        os.fchmod(fd, mode)  # an existing file, or one created under a wider umask
        if gid is not None:
            os.fchown(fd, -1, gid)
    return fd


def narrow(path: Path) -> None:
    """An existing file or directory (written by an older version, or under a wide umask) made owner-only."""
    if path.exists():
        _restrict(path, DIR_MODE if path.is_dir() else FILE_MODE, None)


def create_private_file(path: Path) -> None:
    """Make ``path`` exist as an owner-only file (before a library creates it with the umask's mode); nothing
    when its directory does not exist yet (whoever opens it then reports that)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        os.close(open_private(path))


def _restrict(path: Path, mode: int, gid: int | None) -> None:
    with contextlib.suppress(PermissionError):  # not ours to change: leave it as it is
        os.chmod(path, mode)
        if gid is not None:
            os.chown(path, -1, gid)
