"""What the worker starts in front of an attempt that reads datasets: a private mount namespace in which each
dataset is bind-mounted read-only at its mount point, then ``exec`` of the attempt's own command.

    python -m workers.mount_entry --bind SOURCE AREA TARGET [--bind ...] -- COMMAND...
    python -m workers.mount_entry --probe          # exit 0 when this host can do the above (the worker's start-up)

Run as root (the worker's user), before the attempt drops to its team's user (``setpriv``, which comes after
``--``). The namespace is the attempt's alone (``unshare(CLONE_NEWNS)``, every mount made private first, so nothing
propagates back to the host), and dies with its last process. Each source is opened without following a final
link and checked again through ``/proc/self/fd`` to lie in its area (the worker checked it too; this closes the
window between the two), then mounted from that descriptor: what is mounted is what was checked. The bind is not
recursive (a mount below the dataset is not carried into the attempt) and is remounted read-only, nosuid, nodev:
a write into it fails with EROFS, whoever the attempt runs as. The attempt user cannot undo it (no capabilities).

Only the standard library: this runs between fork and the trainer, for every attempt.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import tempfile

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
EXIT_SETUP = 70  # EX_SOFTWARE: the namespace could not be made (a host failure: the attempt is restarted)


class MountError(OSError):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise MountError(code, f"{what}: {os.strerror(code)}")


def private_namespace(libc: ctypes.CDLL) -> None:
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")


def bind_read_only(libc: ctypes.CDLL, source: str, area: str, target: str) -> None:
    fd = os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        if real != area and not real.startswith(area.rstrip("/") + "/"):
            raise MountError(errno.EXDEV, f"{source} is now {real}, outside {area}")
        via = f"/proc/self/fd/{fd}".encode()
        _check(libc.mount(via, target.encode(), None, MS_BIND, None), f"bind-mounting {source} on {target}")
    finally:
        os.close(fd)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    _check(libc.mount(None, target.encode(), None, flags, None), f"remounting {target} read-only")


def probe() -> str | None:
    """Whether this process can make a private namespace with a read-only bind that refuses a write: None if so,
    else why not. Run in a child process: it changes the namespace of the process that runs it."""
    try:
        libc = _libc()
        private_namespace(libc)
        with tempfile.TemporaryDirectory(prefix="kiln-probe-") as tmp:
            source, target = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
            os.mkdir(source)
            os.mkdir(target)
            bind_read_only(libc, source, tmp, target)
            try:
                with open(os.path.join(target, "w"), "w"):
                    pass
            except OSError as exc:
                if exc.errno == errno.EROFS:
                    return None
                return f"a write into the read-only bind failed with {exc.strerror}, not EROFS"
            finally:
                libc.umount2(target.encode(), 2)  # MNT_DETACH
            return "a write into the read-only bind succeeded"
    except OSError as exc:
        return str(exc)


def main(argv: list[str]) -> int:
    if argv == ["--probe"]:
        why = probe()
        if why is not None:
            print(why, file=sys.stderr)
            return 1
        return 0
    binds: list[tuple[str, str, str]] = []
    i = 0
    while i < len(argv) and argv[i] == "--bind":
        binds.append((argv[i + 1], argv[i + 2], argv[i + 3]))
        i += 4
    if i >= len(argv) or argv[i] != "--" or i + 1 >= len(argv):
        print("usage: python -m workers.mount_entry --bind SOURCE AREA TARGET ... -- COMMAND...", file=sys.stderr)
        return 64
    command = argv[i + 1 :]
    try:
        libc = _libc()
        private_namespace(libc)
        for source, area, target in binds:
            bind_read_only(libc, source, area, target)
    except OSError as exc:
        print(f"[kiln-mounts] could not mount the job's datasets: {exc}", file=sys.stderr, flush=True)
        return EXIT_SETUP
    print(f"[kiln-mounts] {len(binds)} dataset(s) mounted read-only in a private mount namespace", flush=True)
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
