"""A real storage fault: a directory made read-only by a read-only bind mount of itself.

Writes into it fail with ``OSError(30, 'Read-only file system')`` (EROFS) as they do on storage that was remounted
read-only, for root too (tests run as root, and ``chmod`` stops no root). Undone by unmounting: the directory and
what was in it are as before. Mounts are made with the C library's ``mount(2)`` (no process) in this process's
mount namespace; ``shared_mount`` lets such a fault reach a sandbox started before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_PRIVATE, MS_SHARED = 1, 32, 4096, 1 << 18, 1 << 20
MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(rc: int, path: Path) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))


def make_read_only(path: Path) -> None:
    """Mount a read-only view of ``path`` on itself. It is made read-only aside (a private staging mount) and then
    bound into place, because a mount's read-only flag is copied to the copies a shared mount propagates, while a
    later remount to read-only is not: remounted in place, a sandbox's copy stayed writable."""
    stage = Path(tempfile.mkdtemp(prefix="kiln-ro-"))
    try:
        _check(_libc.mount(os.fsencode(path), os.fsencode(stage), None, MS_BIND, None), stage)
        try:
            _check(_libc.mount(None, os.fsencode(stage), None, MS_PRIVATE, None), stage)
            _check(_libc.mount(None, os.fsencode(stage), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), stage)
            _check(_libc.mount(os.fsencode(stage), os.fsencode(path), None, MS_BIND, None), path)
        finally:
            _libc.umount2(os.fsencode(stage), MNT_DETACH)
    finally:
        stage.rmdir()


def make_writable(path: Path) -> None:
    _check(_libc.umount2(os.fsencode(path), MNT_DETACH), path)


@contextlib.contextmanager
def shared_mount(path: Path) -> Iterator[None]:
    """``path`` bound onto itself as a shared mount while the block runs: a mount made under it later reaches the
    mount namespaces that bound it after this (a sandbox's, whose mounts are slaves of the host's), as a remount of
    the real storage would. The host's mounts here are private, which would keep a fault out of the sandbox."""
    target = os.fsencode(path)
    _check(_libc.mount(target, target, None, MS_BIND, None), path)
    try:
        _check(_libc.mount(None, target, None, MS_SHARED, None), path)
        yield
    finally:
        make_writable(path)


def require_mounts(tmp: Path) -> None:
    """Skip unless this process may mount (root with CAP_SYS_ADMIN, as the CI runs)."""
    probe = tmp / ".mount-probe"
    probe.mkdir(exist_ok=True)
    try:
        make_read_only(probe)
    except OSError as exc:
        pytest.skip(f"cannot make a read-only bind mount here: {exc}")
    make_writable(probe)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    make_read_only(path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # already undone by the test
            make_writable(path)
