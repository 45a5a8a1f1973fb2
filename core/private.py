"""Files that hold secrets or a team's work are kiln's alone: owner-only modes (0600 files, 0700 directories).

Where the API and the workers run as different users on a shared volume (``docker-compose.yml``: the API as
``kiln``, the worker as root), the API must still read the attempt logs a worker writes: ``KILN_STORAGE_GID``
names the one group that may read them (0640 files, 0750 directories, that group); still nobody else.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

FILE_MODE, DIR_MODE = 0o600, 0o700
# A file the worker writes for an attempt (its spec, lease, fence) inside the attempt user's 0700 directory:
# readable by whoever may enter that directory (the team's user), no one else.
HANDED_FILE_MODE = 0o644
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


def replace_file(path: Path, content: str, *, durable: bool = False) -> None:
    """Atomically replace ``path`` (a temporary file, then a rename) in a directory an attempt's user may write
    to, as a privileged writer: the temporary file is created new (``O_EXCL``: never through a link the job
    planted) under a name nobody can guess, and the rename replaces a link at ``path`` instead of following it.
    ``durable``: fsync the file and the directory."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, HANDED_FILE_MODE)
    try:
        os.fchmod(fd, HANDED_FILE_MODE)  # whatever the umask (the worker's is 077)
        os.write(fd, content.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def read_regular(path: Path, offset: int = 0) -> bytes:
    """The bytes of ``path`` from ``offset``, where an attempt's user may have put anything there: a link is not
    followed and anything but a regular file (a FIFO that would block the reader forever) is refused (OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.lseek(fd, offset, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
