"""What every archive entry is checked against: the limits, the entry kinds, the rules for a path, the errors."""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

DIGEST_PATTERN = r"^[0-9a-f]{64}$"
IGNORE_FILES = (".gitignore", ".kilnignore")
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".kiln/", ".venv/")
CHUNK = 1 << 20

# What one archive may hold besides the configured limits (ArchiveLimits). Each bounds the Python work or the
# memory one entry may cost, so that checking any archive up to the upload limit takes about a second.
MAX_NAME_BYTES = 1024  # a path or a link's target, UTF-8
MAX_COMPONENT_BYTES = 255  # one path component (NAME_MAX)
MAX_DEPTH = 64  # components of a path
MAX_LINK_COMPONENTS = 2 * MAX_DEPTH  # components of a link's target ('..' included)
MAX_LINK_LEVELS = 40  # links followed inside one another while a target is resolved (Linux's MAXSYMLINKS)
MAX_LINK_BYTES_TOTAL = 2 << 20  # all link targets of the archive together
# One pax extended header ('x', 'g') or GNU long name or link ('L', 'K'): a path and a link target at their
# limits take about 2.1 KiB as pax records, the usual others (times, owners, size) a few hundred bytes; 8 KiB
# leaves room for the extended attributes other tools record (GNU tar --xattrs, bsdtar) and still bounds what
# the reader holds for one entry.
MAX_EXTENDED_BYTES = 8 << 10
MAX_PAX_RECORDS = 64  # records of one pax header
PAX_RECORDS_PER_ENTRY = 16  # records in all: at most this many times the entries allowed
MAX_EXTENDED_TOTAL = 32 << 20  # bytes of all extended headers together
MAX_GLOBAL_HEADERS = 8  # pax global headers ('g'; git archive writes one)

BLOCK = 512

FILE, DIRECTORY, LINK = "file", "directory", "link"


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class ArchiveError(ValueError):
    """The archive (or the directory to pack) breaks a rule; the message names the entry."""


@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
    max_unpacked_bytes: int
    max_entries: int


@dataclasses.dataclass(frozen=True)
class ArchiveSummary:
    entries: int
    unpacked_bytes: int


def show(name: str) -> str:
    """A name for a message: quoted, control characters escaped, at most 100 characters of it."""
    return repr(name) if len(name) <= 100 else repr(name[:100]) + f"... ({len(name)} characters)"


@dataclasses.dataclass(slots=True)
class Member:
    """One entry of an archive, its header checked."""

    name: str  # as the archive wrote it (for messages)
    kind: str  # FILE, DIRECTORY or LINK
    parts: tuple[str, ...]  # the path's components, '' and '.' left out
    size: int
    mode: int
    target: str  # a link's


DRIVE = re.compile(r"^[A-Za-z]:")


def path_parts(name: str) -> tuple[str, ...]:
    """The components of an entry's path; refuses absolute paths, '..', NUL, and names over the limits."""
    if "\x00" in name:
        raise ArchiveError(f"{show(name)}: invalid name (NUL)")
    if name.startswith("/") or DRIVE.match(name):
        raise ArchiveError(f"{show(name)}: absolute path")
    if "\\" in name:
        raise ArchiveError(f"{show(name)}: a backslash in the name (a Windows path?)")
    size = len(name) if name.isascii() else len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ArchiveError(f"{show(name)}: name over {MAX_NAME_BYTES} bytes ({size})")
    split = name.split("/")
    parts = tuple(p for p in split if p and p != ".") if "" in split or "." in split else tuple(split)
    if ".." in parts:
        raise ArchiveError(f"{show(name)}: path leaves the archive ('..')")
    if len(parts) > MAX_DEPTH:
        raise ArchiveError(f"{show(name)}: more than {MAX_DEPTH} levels of directories")
    if size > MAX_COMPONENT_BYTES and (
        max(map(len, parts)) > MAX_COMPONENT_BYTES
        or (not name.isascii() and any(len(p.encode()) > MAX_COMPONENT_BYTES for p in parts))
    ):
        raise ArchiveError(f"{show(name)}: a component of the path is over {MAX_COMPONENT_BYTES} bytes")
    return parts
