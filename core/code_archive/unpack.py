"""Checking an archive, and unpacking it without ever writing through a link (the worker's side)."""

from __future__ import annotations

import errno
import hashlib
import os
import zlib
from pathlib import Path
from typing import BinaryIO

from .base import CHUNK, DIRECTORY, FILE, ArchiveError, ArchiveLimits, ArchiveSummary, Member, Readable, show
from .reader import Inflater, TarReader
from .tree import Tree

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Writer:
    """Creates entries under the directory open as ``root`` without ever following a link: each path is walked one
    component at a time from its parent's descriptor with O_NOFOLLOW, a missing directory made there; files are
    created with O_EXCL. Modes: directories 0755, files 0644 or 0755; no owners set."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._parts: list[str] = []  # the directory last walked to,
        self._fds: list[int] = []  # and each directory on the way there, held open

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._parts, self._fds = [], []

    def directory(self, parts: tuple[str, ...], entry: str) -> int:
        """A descriptor of the directory ``parts`` (the writer's: not to be closed), made where missing; the
        directories it shares with the last one walked to are not walked again."""
        same, most = 0, min(len(parts), len(self._parts))
        while same < most and parts[same] == self._parts[same]:
            same += 1
        for fd in self._fds[same:]:
            os.close(fd)
        del self._fds[same:], self._parts[same:]
        fd = self._fds[-1] if self._fds else self.root
        try:
            for part in parts[same:]:
                try:
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    os.fchmod(fd, 0o755)
                self._fds.append(fd)
                self._parts.append(part)
        except OSError as exc:
            if isinstance(exc, NotADirectoryError | FileExistsError) or exc.errno == errno.ELOOP:
                raise ArchiveError(f"{show(entry)}: a link or a file is where a directory should be") from None
            raise
        return fd

    def file(self, m: Member, reader: TarReader) -> None:
        parent = self.directory(m.parts[:-1], m.name)
        try:
            fd = os.open(m.parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            raise ArchiveError(f"{show(m.name)}: already exists") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ArchiveError(f"{show(m.name)}: a link is in the way") from None
            raise
        try:
            reader.copy_data(fd)
            os.fchmod(fd, 0o755 if m.mode & 0o111 else 0o644)
        finally:
            os.close(fd)

    def symlink(self, parts: tuple[str, ...], target: str, entry: str) -> None:
        parent = self.directory(parts[:-1], entry)
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
        except FileExistsError:
            raise ArchiveError(f"{show(entry)}: already exists") from None


def scan(
    fh: Readable, limits: ArchiveLimits, writer: Writer | None = None, hasher: hashlib._Hash | None = None
) -> tuple[ArchiveSummary, list[Member]]:
    """Read the whole archive (to its end-of-archive block), checking every member, creating it through
    ``writer`` if one is given (links excepted: returned, to be made last); the tree's resolution of links at the
    end."""
    tree = Tree(limits)
    reader = TarReader(Inflater(fh, hasher), limits)
    links: list[Member] = []
    try:
        for m in reader.members():
            tree.add(m)
            if writer is None:
                continue
            if m.kind == FILE:
                writer.file(m, reader)
            elif m.kind == DIRECTORY:
                if m.parts:
                    writer.directory(m.parts, m.name)
            else:
                writer.directory(m.parts[:-1], m.name)
                links.append(m)
    except zlib.error as exc:
        raise ArchiveError(f"not a readable .tar.gz: {exc}") from None
    return tree.finish(), links


def check(path: Path, limits: ArchiveLimits) -> ArchiveSummary:
    """Every entry of the .tar.gz at ``path`` against the rules above; raises ArchiveError. Nothing is written."""
    with path.open("rb") as fh:
        return scan(fh, limits)[0]


def check_stream(fh: Readable, limits: ArchiveLimits) -> ArchiveSummary:
    """``check`` of what ``fh.read`` returns (b"": the end), read only as far as the end-of-archive block."""
    return scan(fh, limits)[0]


def extract(path: Path, digest: str, dest: Path, limits: ArchiveLimits) -> ArchiveSummary:
    """Verify the archive's digest, then unpack it into the empty directory ``dest`` (made if missing), checking
    every entry again as it goes: files and directories as they come, links last, after the whole archive passed
    and its digest was found the same again. On an error what was unpacked so far stays in ``dest``."""
    with path.open("rb") as fh:
        return extract_file(fh, digest, dest, limits)


def extract_file(fh: BinaryIO, digest: str, dest: Path, limits: ArchiveLimits) -> ArchiveSummary:
    """``extract`` of an open archive (standard input, say). Seekable: hashed whole before anything is written,
    then read again. Not (a pipe): hashed as it is unpacked, so a wrong digest is found only at the end (before any
    link is made; the files so far stay in ``dest``)."""
    if fh.seekable():
        start = fh.tell()
        whole = hashlib.sha256()
        while chunk := fh.read(CHUNK):
            whole.update(chunk)
        actual = whole.hexdigest()
        if actual != digest:
            raise ArchiveError(f"archive {digest[:12]} does not match its digest (found {actual[:12]})")
        fh.seek(start)
    dest.mkdir(parents=True, exist_ok=True)
    root = os.open(dest, _DIR_FLAGS)
    try:
        if os.listdir(root):
            raise ArchiveError(f"{dest} is not empty")
        writer = Writer(root)
        try:
            hasher = hashlib.sha256()
            summary, links = scan(fh, limits, writer, hasher)
            while chunk := fh.read(CHUNK):
                hasher.update(chunk)
            if hasher.hexdigest() != digest:
                found = hasher.hexdigest()[:12]
                raise ArchiveError(f"archive {digest[:12]} does not match its digest (found {found} as it was read)")
            for m in links:
                writer.symlink(m.parts, m.target, m.name)
        finally:
            writer.close()
    finally:
        os.close(root)
    return summary


# ------------------------------------------------------------------------------------------------ the command
