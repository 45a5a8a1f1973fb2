"""The team compile cache on kiln's storage: its layout, its entries, their checks, publishing and collection.

Torch-free, so the three sides share it: the trainer reads and publishes entries, the worker makes and binds the
team's directory, the scheduler's leader collects old entries. One entry is one directory named by its key::

    {storage}/compile_cache/teams/{team id}/{key}/artifacts.bin   torch.compiler.save_cache_artifacts()'s blob
                                                 /entry.json      the key, the fields it hashes, the blob's sha256
                                                                  and size, who wrote it and its cold compile time
    {storage}/compile_cache/shared/{key}/...                      an admin's, for every team (read-only to them)

An entry is trusted only if ``entry.json`` names the key it was looked up by, its fields hash to that key and the
blob has the recorded size and sha256 (``read``); the trainer also compares the compiled step with eager before
using it. The blob is torch's pickle: nothing of it is deserialised before these checks. Root reads a team's
directory too (``promote``, ``collect``), and the team's code may have put anything there: nothing in it is followed
(a link is read, counted and deleted as a link) and nothing but a regular file is read.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = "compile_cache"
TEAMS = "teams"
SHARED = "shared"
BLOB = "artifacts.bin"
ENTRY = "entry.json"
FORMAT = 1  # of entry.json; part of every key, so a new format never reads an old entry
TMP_PREFIX = ".tmp-"
GONE_PREFIX = ".gone-"
STALE_TMP_S = 3600.0  # a publish left half-done by a dead trainer is swept after this
MAX_ENTRY_BYTES = 1 << 20  # entry.json is under 1 kB (a GPT's: 679 bytes); a bigger one is not kiln's: not read


class Rejected(Exception):
    """The entry fails a check: ``check`` names which (entry, key, digest), the message is the reason
    (``COMPILE_CACHE_REJECTED``'s ``check`` and ``reason``)."""

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check


def team_dir(storage: Path, team_id: int) -> Path:
    return storage / ROOT / TEAMS / str(team_id)


def shared_dir(storage: Path) -> Path:
    return storage / ROOT / SHARED


def key_of(fields: Mapping[str, Any]) -> str:
    """The key: a hash of every field that decides the compiled code (``trainer.compile.cache_fields``)."""
    payload = json.dumps({"format": FORMAT, **fields}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class Entry:
    key: str
    fields: dict[str, Any]
    sha256: str
    size_bytes: int
    torch: str | None
    triton: str | None
    job_id: str | None
    attempt: str | None
    written_at: float
    cold_compile_s: float | None  # the writer's compile time, so a hit can say what it saved
    format: int = FORMAT

    @classmethod
    def for_blob(cls, fields: dict[str, Any], blob: bytes, **writer: Any) -> Entry:
        return cls(
            key=key_of(fields),
            fields=fields,
            sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob),
            torch=fields.get("torch"),
            triton=fields.get("triton"),
            written_at=time.time(),
            **writer,
        )

    @classmethod
    def parse(cls, raw: bytes) -> Entry:
        try:
            data = json.loads(raw)
            entry = cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
        except (ValueError, TypeError, KeyError) as exc:
            raise Rejected("entry", f"{ENTRY} is not a kiln cache entry: {exc!r}"[:300]) from None
        if type(entry.size_bytes) is not int or entry.size_bytes < 0:  # it bounds the blob's read
            raise Rejected("entry", f"{ENTRY}'s size_bytes is not a size: {entry.size_bytes!r}"[:300])
        return entry


def read(root: Path, key: str) -> tuple[Entry, bytes] | None:
    """The entry ``key`` under ``root`` and its blob, checked; None when there is none; ``Rejected`` when it fails a
    check. A team's code may put anything in its directory and root reads it (``promote``): only a real directory
    and regular files in it are read, never through a link, and no more bytes than an entry has."""
    where = root / key
    try:
        dir_fd = _open_key_dir(where)
    except FileNotFoundError:
        return None
    try:
        return _read_entry(where, dir_fd, key)
    finally:
        os.close(dir_fd)


def _read_entry(where: Path, dir_fd: int, key: str) -> tuple[Entry, bytes] | None:
    try:
        with _regular_file(dir_fd, ENTRY, "entry") as (fd, _):
            raw = _read_at_most(fd, MAX_ENTRY_BYTES)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_ENTRY_BYTES:
        raise Rejected("entry", f"{ENTRY} is over {MAX_ENTRY_BYTES} bytes, more than kiln writes")
    entry = Entry.parse(raw)
    if entry.key != key:
        raise Rejected("key", f"{ENTRY} names key {entry.key!r}, not {key}")
    if key_of(entry.fields) != key:
        raise Rejected("key", f"{ENTRY}'s fields hash to {key_of(entry.fields)}, not {key}")
    try:
        with _regular_file(dir_fd, BLOB, "digest") as (fd, size):
            if size != entry.size_bytes:  # refused unread
                raise Rejected("digest", f"{BLOB} has {size} bytes, the entry says {entry.size_bytes}")
            blob = _read_at_most(fd, size)
    except FileNotFoundError:
        if not _still_at(where, dir_fd):  # collected between the two reads: a miss
            return None
        raise Rejected("digest", f"{BLOB} is missing") from None
    if len(blob) != entry.size_bytes:  # it changed while read
        raise Rejected("digest", f"{BLOB} has {len(blob)} bytes, the entry says {entry.size_bytes}")
    digest = hashlib.sha256(blob).hexdigest()
    if digest != entry.sha256:
        raise Rejected("digest", f"{BLOB}'s sha256 {digest[:16]}... is not the entry's {entry.sha256[:16]}...")
    return entry, blob


def _open_key_dir(where: Path) -> int:
    """The key's directory, opened without following a link: its files are then opened from this descriptor, so
    the directory cannot be swapped for a link (to ``/``) between this check and the reads."""
    try:
        return os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:  # Linux says ENOTDIR, not ELOOP, for a link opened with O_DIRECTORY
        if where.is_symlink():
            raise Rejected("entry", f"{where.name} is a link, not a directory kiln wrote") from None
        raise Rejected("entry", f"{where.name} is not a directory") from None


@contextlib.contextmanager
def _regular_file(dir_fd: int, name: str, check: str) -> Iterator[tuple[int, int]]:
    """``name`` in the key's directory, open, and its size, if it is a regular file: a link is not followed (its
    target is never opened, nor anything said of it) and a FIFO is refused without blocking."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Rejected(check, f"{name} is a link, not a file kiln wrote") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Rejected(check, f"{name} is not a regular file")
        yield fd, st.st_size
    finally:
        os.close(fd)


def _read_at_most(fd: int, size: int) -> bytes:
    """``size`` bytes and one more if there is one, so a file longer than expected shows without being read whole."""
    chunks: list[bytes] = []
    left = size + 1
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _still_at(where: Path, dir_fd: int) -> bool:
    """Whether the directory opened as ``dir_fd`` is still the one at ``where`` (not renamed aside by ``discard``)."""
    try:
        here = os.lstat(where)
    except FileNotFoundError:
        return False
    there = os.fstat(dir_fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fd, 0o644)  # whatever the umask: a shared entry is read by every team's uid (a team's own
        fh.write(data)  # entries sit in its 0700 directory, closed to the others)
        fh.flush()
        os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(root: Path, entry: Entry, blob: bytes) -> bool:
    """Publish atomically: both files written and fsynced in a temporary directory beside the entry's, then one
    rename. The first writer of a key wins: renaming onto a published (non-empty) directory fails, and a later
    writer drops its copy. False when another writer was first."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{entry.key}-{secrets.token_hex(6)}"
    tmp.mkdir()
    os.chmod(tmp, 0o755)
    try:
        _write_synced(tmp / BLOB, blob)
        _write_synced(tmp / ENTRY, json.dumps(dataclasses.asdict(entry), indent=2, sort_keys=True).encode())
        _fsync_dir(tmp)
        try:
            os.rename(tmp, root / entry.key)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return False
        _fsync_dir(root)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once renamed


def discard(root: Path, key: str) -> bool:
    """Take an entry away: renamed aside first (a reader never sees half of it), then deleted. False if it was
    already gone (another rank or the collector took it)."""
    gone = root / f"{GONE_PREFIX}{key}-{secrets.token_hex(6)}"
    try:
        os.rename(root / key, gone)  # renames a link itself, never its target
    except FileNotFoundError:
        return False
    _remove(gone)
    return True


def _remove(path: Path) -> None:
    """Delete what ``path`` names, never what it points to and never blocking, where a team's code may be changing
    it as it goes. What fails (a name swapped under us) is left to the next sweep; so is a tree nested deeper than
    Python's recursion (kiln writes one level), which would otherwise end the collection of every team."""
    with contextlib.suppress(OSError, RecursionError):
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _remove_at(parent, path.name)
        finally:
            os.close(parent)


def _remove_at(parent: int, name: str) -> None:
    """``name`` in the directory open as ``parent``: a directory is opened without following a link and emptied
    through its descriptor; anything else (a link, a file, a FIFO) is unlinked as it is. Not shutil.rmtree: it
    refuses a link, and its open of what it was given would block for ever on a FIFO swapped in after its check
    (O_DIRECTORY fails at once on one)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except NotADirectoryError:
        os.unlink(name, dir_fd=parent)
        return
    try:
        with os.scandir(fd) as children:
            names = [child.name for child in children]
        for child in names:
            _remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def touch(root: Path, key: str) -> None:
    """Mark an entry used now: the collector goes by last use, the directory's mtime."""
    with contextlib.suppress(OSError):  # the shared tier is read-only to teams: its entries are never collected
        os.utime(root / key)


@dataclasses.dataclass
class Collected:
    entries: int = 0
    bytes: int = 0


def _entry_size(path: Path) -> int | None:
    """The bytes of an entry's two files as they lie; None when it holds anything else (another name, a link, a
    directory, a FIFO): ``publish`` writes those two regular files only, so anything more is not kiln's, and space
    a team's code keeps there would pass the quota unseen. The directory is opened without following a link, so a
    swap for one after the caller's check lists nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        total = 0
        with os.scandir(fd) as files:
            for f in files:
                st = f.stat(follow_symlinks=False)
                if f.name not in (ENTRY, BLOB) or not stat.S_ISREG(st.st_mode):
                    return None
                total += st.st_size
        return total
    finally:
        os.close(fd)


def collect_team(root: Path, *, max_age_s: float, quota_bytes: int, now: float) -> Collected:
    """One team's entries: those unused for ``max_age_s`` (0: no age limit), then the least recently used until the
    rest fit ``quota_bytes``; and publishes or discards a dead trainer left behind. Run as root over what a team's
    code may have changed: ``lstat`` only, so a link is judged as a link and never followed; what is not an entry
    as kiln writes one goes at once."""
    done = Collected()
    live: list[tuple[float, int, str]] = []
    for path in root.iterdir():
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # gone, or swapped, since listed
            st = os.lstat(path)
            if path.name.startswith((TMP_PREFIX, GONE_PREFIX)):
                if abs(now - st.st_mtime) > STALE_TMP_S:  # a time ahead of now is a team's, not a live writer's
                    _remove(path)
            elif stat.S_ISDIR(st.st_mode) and (size := _entry_size(path)) is not None:
                live.append((st.st_mtime, size, path.name))
            else:  # a link (to a host directory, to /), a file, a FIFO, a directory holding more than an entry
                _remove(path)
                done.entries += 1
                done.bytes += st.st_size
    live.sort()  # least recently used first
    total = sum(size for _, size, _ in live)
    for mtime, size, key in live:
        if not (max_age_s and now - mtime > max_age_s) and total <= quota_bytes:
            break
        if discard(root, key):
            done.entries += 1
            done.bytes += size
        total -= size
    return done


def collect(storage: Path, *, max_age_s: float, quota_bytes: int, now: float | None = None) -> Collected:
    """Every team's cache (the admin's shared tier is the admin's to manage). Run by the scheduler's leader."""
    done = Collected()
    teams = storage / ROOT / TEAMS
    if not _is_dir(teams):
        return done
    for root in sorted(teams.iterdir()):
        if _is_dir(root):  # kiln's own directories (a team cannot write in teams/): anything else is not followed
            got = collect_team(root, max_age_s=max_age_s, quota_bytes=quota_bytes, now=now or time.time())
            done.entries += got.entries
            done.bytes += got.bytes
    return done


def _is_dir(path: Path) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def promote(storage: Path, team_id: int, key: str) -> bool:
    """An admin's publish for every team: a team's entry, checked, copied into the shared tier. False if the shared
    tier already has the key."""
    found = read(team_dir(storage, team_id), key)
    if found is None:
        raise FileNotFoundError(f"team {team_id} has no compile-cache entry {key}")
    entry, blob = found
    return publish(shared_dir(storage), entry, blob)


def main(argv: list[str] | None = None) -> int:
    """``python -m core.compile_cache promote --storage DIR --team ID --key KEY`` (on a host with the storage)."""
    parser = argparse.ArgumentParser(prog="python -m core.compile_cache")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("promote", help="copy a team's verified entry into the shared tier, for every team")
    cmd.add_argument("--storage", type=Path, required=True)
    cmd.add_argument("--team", type=int, required=True)
    cmd.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    try:
        new = promote(args.storage, args.team, args.key)
    except (Rejected, FileNotFoundError) as exc:
        print(f"not promoted: {exc}")
        return 1
    print(f"{args.key}: {'published to' if new else 'already in'} {shared_dir(args.storage)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
