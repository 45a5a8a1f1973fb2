"""A user's code as one archive: packed by the CLI, checked by the API, unpacked by the worker.

The archive is a gzipped tar whose bytes depend only on the files' paths, contents and executable bits (sorted
entries, zero times and owners, gzip without a timestamp), so its SHA-256 names the code: a second ``kiln submit
--workdir`` of unchanged code finds the digest already stored and sends nothing.

What an archive may hold: regular files, directories and symbolic links whose targets stay inside it. Absolute
paths, ``..`` components, hard links, devices, FIFOs, a link whose target leaves the archive (lexically, or through
other links of the archive), an entry written through a link, two entries of one name, and an archive over its
limits (bytes unpacked, entries, sizes of names and headers, depth) are refused: ``ArchiveError``, its message
naming the entry.

Neither the API nor the worker lets ``tarfile`` read an uploaded archive. Both stream it through the reader
below: gzip inflated at most ``_OUT_STEP`` bytes at a time, 512-byte headers parsed here (checksum included),
pax and GNU long-name headers accepted up to ``MAX_EXTENDED_BYTES``, and every entry's path and every link's
target resolved through the links of the archive itself (``_Tree``), never through the file system. The work is
bounded by the limits: inflated bytes by the unpacked limit plus the headers' (each counted before it is read),
Python work per entry by the caps on names, depth, links and records. The worker (``extract``; as a command, ``python
-m core.code_archive extract``) checks everything again while it creates each entry itself under the destination,
walking every path one component at a time with ``O_NOFOLLOW`` from the destination's descriptor, files with
``O_EXCL``, modes 0644/0755, and the links last, once nothing else is left to write, so no write goes through a link.
Only the standard library runs on that path (``pack`` alone imports ``tarfile``, for trusted data).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import hashlib
import io
import json
import os
import re
import stat
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn, Protocol

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
_IN_STEP = 64 << 10  # compressed bytes read at a time
_OUT_STEP = 256 << 10  # the most one inflate step may produce
_ZERO_BLOCK = bytes(BLOCK)

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


def artifact_path(storage: Path, team_id: int, digest: str) -> Path:
    """Where the artifact store keeps a team's archive (the API writes it, workers read it)."""
    return storage / "artifacts" / str(team_id) / f"{digest}.tar.gz"


def _show(name: str) -> str:
    """A name for a message: quoted, control characters escaped, at most 100 characters of it."""
    return repr(name) if len(name) <= 100 else repr(name[:100]) + f"... ({len(name)} characters)"


# ----------------------------------------------------------------------------------------------- ignore rules


@dataclasses.dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _glob_regex(pattern: str) -> str:
    """A gitignore glob as a regex: ``*`` and ``?`` stay within one path component, ``**`` spans them."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            close = pattern.index("]", i + 1)
            body = pattern[i + 1 : close].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = close + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _rule(line: str, base: str) -> _Rule | None:
    """One line of a .gitignore (gitignore(5)): ``!`` negates, a trailing ``/`` matches directories only, a
    pattern with a ``/`` before its end is anchored to the ignore file's directory, ``**`` spans directories."""
    line = line.rstrip()
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    prefix = re.escape(base + "/") if base else ""
    head = prefix if anchored else prefix + "(?:.*/)?"
    return _Rule(re.compile(f"^{head}{_glob_regex(line)}$"), negate, dir_only)


class IgnoreRules:
    """The ignore files of a tree, read as git reads them: later rules win, deeper files after shallower ones."""

    def __init__(self) -> None:
        self.rules: list[_Rule] = []
        for pattern in ALWAYS_IGNORED:
            rule = _rule(pattern, "")
            assert rule is not None
            self.rules.append(rule)

    def read(self, directory: Path, rel: str) -> None:
        for name in IGNORE_FILES:
            path = directory / name
            if path.is_file():
                for line in path.read_text(errors="replace").splitlines():
                    rule = _rule(line, rel)
                    if rule is not None:
                        self.rules.append(rule)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict = False
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(rel):
                verdict = not rule.negate
        return verdict


# ------------------------------------------------------------------------------------------------------ pack


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(archive path, file) for everything of ``root`` that no ignore rule excludes, in a fixed order."""
    rules = IgnoreRules()

    def visit(directory: Path, rel: str) -> Iterator[tuple[str, Path]]:
        rules.read(directory, rel)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = Path(entry.path)
            name = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if rules.ignored(name, is_dir):
                continue
            yield name, path
            if is_dir:
                yield from visit(path, name)

    yield from visit(root, "")


def pack(root: Path, out: BinaryIO, limits: ArchiveLimits | None = None) -> ArchiveSummary:
    """Write ``root`` as a reproducible .tar.gz to ``out``; raises ArchiveError for what the API would refuse."""
    import gzip  # trusted data only: the reader below never uses tarfile
    import tarfile

    root = root.resolve()
    if not root.is_dir():
        raise ArchiveError(f"{root} is not a directory")
    tree = _Tree(limits or ArchiveLimits(max_unpacked_bytes=sys.maxsize, max_entries=sys.maxsize))
    with (
        gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, path in _walk(root):
            st = path.lstat()
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                tree.add(_Member(name, LINK, _parts(name), 0, 0o777, target))
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mode = 0o777
                tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                tree.add(_Member(name, DIRECTORY, _parts(name), 0, 0o755, ""))
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                tree.add(_Member(name, FILE, _parts(name), st.st_size, info.mode, ""))
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                raise ArchiveError(f"{name}: not a regular file, directory or link (sockets, devices, FIFOs)")
    return tree.finish()


def pack_bytes(root: Path, limits: ArchiveLimits | None = None) -> tuple[bytes, ArchiveSummary]:
    buf = io.BytesIO()
    summary = pack(root, buf, limits)
    return buf.getvalue(), summary


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------- reading


class _Inflater:
    """The tar stream inside the gzip stream of ``fh``, never more than ``_OUT_STEP`` inflated at once, so that a
    decompression bomb costs only what the reader asks for: the tar parser asks for a header, or for the data of
    a member whose size it has already counted against the limits. Concatenated gzip members are one stream
    (zero bytes between them skipped, as gzip does). ``hasher`` sees every compressed byte read."""

    def __init__(self, fh: Readable, hasher: hashlib._Hash | None = None) -> None:
        self._fh = fh
        self._hasher = hasher
        self._z: zlib._Decompress | None = None  # None: at the start of a gzip member
        self._tail = b""  # compressed, not yet inflated
        self._buf = b""  # inflated, not yet handed out
        self._pos = 0

    def _feed(self) -> bytes:
        chunk = self._fh.read(_IN_STEP)
        if chunk and self._hasher is not None:
            self._hasher.update(chunk)
        return chunk

    def _more(self) -> bytes:
        """The next inflated bytes (at most _OUT_STEP); b"" at the end of the last gzip member."""
        while True:
            if self._z is None:
                tail = self._tail.lstrip(b"\0")
                while not tail:
                    chunk = self._feed()
                    if not chunk:
                        self._tail = b""
                        return b""
                    tail = chunk.lstrip(b"\0")
                self._tail = tail
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip only
            if not self._tail:
                self._tail = self._feed()
                if not self._tail:
                    raise ArchiveError("not a readable .tar.gz: the gzip stream ends early")
            out = self._z.decompress(self._tail, _OUT_STEP)
            if self._z.eof:
                self._tail = self._z.unused_data
                self._z = None
            else:
                self._tail = self._z.unconsumed_tail
            if out:
                return out

    def read(self, n: int, eof_ok: bool = False, what: str = "an entry") -> bytes:
        """Exactly ``n`` bytes; b"" instead when ``eof_ok`` and the stream ended before the first of them."""
        end = self._pos + n
        if end <= len(self._buf):
            out = self._buf[self._pos : end]
            self._pos = end
            return out
        parts = [self._buf[self._pos :]]
        need = end - len(self._buf)
        while need > 0:
            more = self._more()
            if not more:
                if eof_ok and need == n:
                    return b""
                raise ArchiveError(f"not a readable .tar.gz: the archive ends inside {what}")
            if len(more) > need:
                parts.append(more[:need])
                self._buf, self._pos = more, need
                return b"".join(parts)
            parts.append(more)
            need -= len(more)
        self._buf, self._pos = b"", 0
        return b"".join(parts)

    def pieces(self, n: int) -> Iterator[bytes]:
        """The next ``n`` bytes in pieces of at most _OUT_STEP."""
        while n > 0:
            if self._pos >= len(self._buf):
                self._buf, self._pos = self._more(), 0
                if not self._buf:
                    raise ArchiveError("not a readable .tar.gz: the archive ends inside an entry")
            take = min(n, len(self._buf) - self._pos)
            yield self._buf[self._pos : self._pos + take]
            self._pos += take
            n -= take

    def skip(self, n: int) -> None:
        for _ in self.pieces(n):
            pass


@dataclasses.dataclass(slots=True)
class _Member:
    name: str  # as the archive wrote it (for messages)
    kind: str  # FILE, DIRECTORY or LINK
    parts: tuple[str, ...]  # the path's components, '' and '.' left out
    size: int
    mode: int
    target: str  # a link's


_OCTAL = re.compile(rb" *([0-7]*) *")
_PAX_LENGTH = re.compile(rb"([0-9]{1,5}) ")
_DECIMAL = re.compile(rb"[0-9]{1,20}")
_DRIVE = re.compile(r"^[A-Za-z]:")


def _number(field: bytes, what: str, name: str) -> int:
    """A numeric header field: octal digits (NUL- or space-terminated) or GNU's base-256."""
    if field[0] & 0x80:
        if field[0] & 0x40:
            raise ArchiveError(f"{_show(name)}: negative {what}")
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    match = _OCTAL.fullmatch(field.split(b"\0", 1)[0])
    if match is None:
        raise ArchiveError(f"{_show(name)}: invalid {what} field in its header")
    return int(match.group(1) or b"0", 8)


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError(f"{_show(raw.decode('utf-8', 'replace'))}: {what} is not UTF-8") from None


def _parts(name: str) -> tuple[str, ...]:
    """The components of an entry's path; refuses absolute paths, '..', NUL, and names over the limits."""
    if "\x00" in name:
        raise ArchiveError(f"{_show(name)}: invalid name (NUL)")
    if name.startswith("/") or _DRIVE.match(name):
        raise ArchiveError(f"{_show(name)}: absolute path")
    if "\\" in name:
        raise ArchiveError(f"{_show(name)}: a backslash in the name (a Windows path?)")
    size = len(name) if name.isascii() else len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ArchiveError(f"{_show(name)}: name over {MAX_NAME_BYTES} bytes ({size})")
    split = name.split("/")
    parts = tuple(p for p in split if p and p != ".") if "" in split or "." in split else tuple(split)
    if ".." in parts:
        raise ArchiveError(f"{_show(name)}: path leaves the archive ('..')")
    if len(parts) > MAX_DEPTH:
        raise ArchiveError(f"{_show(name)}: more than {MAX_DEPTH} levels of directories")
    if size > MAX_COMPONENT_BYTES and (
        max(map(len, parts)) > MAX_COMPONENT_BYTES
        or (not name.isascii() and any(len(p.encode()) > MAX_COMPONENT_BYTES for p in parts))
    ):
        raise ArchiveError(f"{_show(name)}: a component of the path is over {MAX_COMPONENT_BYTES} bytes")
    return parts


def _pax(data: bytes, name: str) -> dict[bytes, bytes]:
    """The records of a pax extended header ("%d %s=%s\\n", the length counting itself); later records win."""
    records: dict[bytes, bytes] = {}
    pos, n, count = 0, len(data), 0
    while pos < n:
        match = _PAX_LENGTH.match(data, pos)
        if match is None:
            if not data[pos:].strip(b"\0"):
                break
            raise ArchiveError(f"{_show(name)}: malformed pax header")
        end = pos + int(match.group(1))
        if end <= match.end() or end > n or data[end - 1] != 0x0A:
            raise ArchiveError(f"{_show(name)}: malformed pax header")
        key, eq, value = data[match.end() : end - 1].partition(b"=")
        if not eq or not key:
            raise ArchiveError(f"{_show(name)}: malformed pax header")
        count += 1
        if count > MAX_PAX_RECORDS:
            raise ArchiveError(f"{_show(name)}: pax header of more than {MAX_PAX_RECORDS} records")
        records[key] = value
        pos = end
    return records


class _TarReader:
    """The members of the tar stream of ``src``, each checked as a header before its data is read: what
    ``members`` yields has a type kiln accepts, a checked name and a size; the caller either copies its data
    (``copy_data``) or leaves it, and the reader skips what is left before the next header."""

    def __init__(self, src: _Inflater, limits: ArchiveLimits) -> None:
        self.src = src
        self.limits = limits
        self.members_read = 0
        self.pax_records = 0
        self.extended_bytes = 0
        self.global_headers = 0
        self._left = 0  # data of the current member not yet read

    def _extended(self, kind: bytes, size: int, name: str) -> bytes:
        what = {b"x": "pax header", b"g": "pax global header", b"L": "long name", b"K": "long link name"}[kind]
        if size > MAX_EXTENDED_BYTES:
            raise ArchiveError(f"{_show(name)}: {what} of {size} bytes (the limit is {MAX_EXTENDED_BYTES})")
        self.extended_bytes += size
        if self.extended_bytes > MAX_EXTENDED_TOTAL:
            raise ArchiveError(f"extended headers of more than {MAX_EXTENDED_TOTAL} bytes in all")
        data = self.src.read(size)
        self.src.skip(-size % BLOCK)
        return data

    def _records(self, data: bytes, name: str) -> dict[bytes, bytes]:
        records = _pax(data, name)
        self.pax_records += len(records)
        if self.pax_records > PAX_RECORDS_PER_ENTRY * self.limits.max_entries:
            raise ArchiveError(f"more than {PAX_RECORDS_PER_ENTRY * self.limits.max_entries} pax records in all")
        if any(key.startswith(b"GNU.sparse.") for key in records):
            raise ArchiveError(f"{_show(name)}: sparse file")
        return records

    def members(self) -> Iterator[_Member]:
        pax: dict[bytes, bytes] | None = None
        long_name: bytes | None = None
        long_link: bytes | None = None
        while True:
            block = self.src.read(BLOCK, eof_ok=True, what="a header")
            if not block or block == _ZERO_BLOCK:  # the end of the archive (or of the stream, at a boundary)
                if pax is not None or long_name is not None or long_link is not None:
                    raise ArchiveError("the archive ends after an extended header")
                return
            raw_name = block[:100].split(b"\0", 1)[0]
            shown = raw_name.decode("utf-8", "replace")
            stored = _number(block[148:156], "checksum", shown)
            if stored != sum(block) - sum(block[148:156]) + 256 and stored != sum(_SIGNED.unpack(block)) + 256:
                raise ArchiveError(f"{_show(shown)}: bad header checksum (not a tar archive?)")
            kind = block[156:157]
            size = _number(block[124:136], "size", shown)
            if kind in (b"x", b"g", b"L", b"K"):
                data = self._extended(kind, size, shown)
                if kind == b"g":
                    self.global_headers += 1
                    if self.global_headers > MAX_GLOBAL_HEADERS:
                        raise ArchiveError(f"more than {MAX_GLOBAL_HEADERS} pax global headers")
                    overrides = {b"path", b"linkpath", b"size"} & self._records(data, shown).keys()
                    if overrides:
                        keys = ", ".join(sorted(k.decode() for k in overrides))
                        raise ArchiveError(f"{_show(shown)}: a pax global header that sets {keys}")
                elif kind == b"x":
                    if pax is not None:
                        raise ArchiveError(f"{_show(shown)}: two pax headers for one entry")
                    pax = self._records(data, shown)
                elif kind == b"L":
                    if long_name is not None:
                        raise ArchiveError(f"{_show(shown)}: two long names for one entry")
                    long_name = data.split(b"\0", 1)[0]
                else:
                    if long_link is not None:
                        raise ArchiveError(f"{_show(shown)}: two long link names for one entry")
                    long_link = data.split(b"\0", 1)[0]
                continue

            if pax is not None and b"path" in pax:
                if long_name is not None:
                    raise ArchiveError(f"{_show(shown)}: both a pax path and a GNU long name")
                raw_name = pax[b"path"]
            elif long_name is not None:
                raw_name = long_name
            elif block[257:263] == b"ustar\x00" and block[345] != 0:  # POSIX ustar: a prefix before the name
                raw_name = block[345:500].split(b"\0", 1)[0] + b"/" + raw_name
            raw_link = block[157:257].split(b"\0", 1)[0]
            if pax is not None and b"linkpath" in pax:
                if long_link is not None:
                    raise ArchiveError(f"{_show(shown)}: both a pax linkpath and a GNU long link name")
                raw_link = pax[b"linkpath"]
            elif long_link is not None:
                raw_link = long_link
            if pax is not None and b"size" in pax:
                if _DECIMAL.fullmatch(pax[b"size"]) is None:
                    raise ArchiveError(f"{_show(shown)}: invalid size in its pax header")
                size = int(pax[b"size"])
            pax = long_name = long_link = None
            name = _text(raw_name, "the name")

            self.members_read += 1
            if self.members_read > self.limits.max_entries:
                raise ArchiveError(f"more than {self.limits.max_entries} entries")
            if kind in (b"0", b"\0", b"7"):
                entry = DIRECTORY if kind == b"\0" and name.endswith("/") else FILE  # V7 marks directories so
            elif kind == b"5":
                entry = DIRECTORY
            elif kind == b"2":
                entry = LINK
            elif kind == b"1":
                raise ArchiveError(f"{_show(name)}: hard link (to {_show(raw_link.decode('utf-8', 'replace'))})")
            elif kind in (b"3", b"4", b"6"):
                what = {b"3": "character device", b"4": "block device", b"6": "FIFO"}[kind]
                raise ArchiveError(f"{_show(name)}: device or FIFO ({what})")
            else:
                raise ArchiveError(f"{_show(name)}: unsupported entry type {kind!r}")
            if entry == FILE and name.endswith("/"):
                raise ArchiveError(f"{_show(name)}: a file whose name ends in '/'")
            if entry != FILE and size:
                raise ArchiveError(f"{_show(name)}: a {entry} with {size} bytes of data")
            mode = _number(block[100:108], "mode", name)
            target = _text(raw_link, "the link's target") if entry == LINK else ""
            self._left = size
            yield _Member(name, entry, _parts(name), size, mode, target)
            if self._left:
                self.src.skip(self._left)
            self.src.skip(-size % BLOCK)
            self._left = 0

    def copy_data(self, fd: int) -> None:
        """Write the current member's data to ``fd``."""
        for piece in self.src.pieces(self._left):
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view) :]
        self._left = 0


_SIGNED = struct.Struct("148b8x356b")  # the header less its checksum field, as signed bytes (old tars summed so)


# ------------------------------------------------------------------------------------------------- the tree


class _Tree:
    """What the archive unpacks to, as a tree of names (no file system involved): entries are added in the
    archive's order, with the directories their paths imply; ``finish`` resolves every link's target through the
    links of the archive, as the kernel would once everything is unpacked.

    Rules: no entry's path goes through a link or a file (an entry written through a link), no name twice (a
    directory may be repeated), every link's target stays inside however the links it meets resolve. Memory:
    under a kilobyte a node (a directory's path is kept as a tuple of shared names; entries count the directories
    their paths imply, so nodes <= max_entries: 16 MB for 20,000 directories 64 deep) plus the link targets
    (MAX_LINK_BYTES_TOTAL)."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.kind: list[str] = [DIRECTORY]  # node 0: the archive's root
        self.parent: list[int] = [0]
        self.name: list[str] = [""]
        self.children: dict[tuple[int, str], int] = {}
        self.targets: dict[int, str] = {}
        self.unpacked = 0
        self.link_bytes = 0
        self._dirs: dict[tuple[str, ...], int] = {(): 0}  # every directory's path, to its node
        self._names: dict[str, str] = {}  # one string per name, shared by the paths above

    def path(self, node: int) -> str:
        names = []
        while node:
            names.append(self.name[node])
            node = self.parent[node]
        return "/".join(reversed(names))

    def _new(self, parent: int, name: str, kind: str) -> int:
        node = len(self.kind)
        if node > self.limits.max_entries:
            raise ArchiveError(f"more than {self.limits.max_entries} entries (with the directories their paths imply)")
        self.kind.append(kind)
        self.parent.append(parent)
        self.name.append(name)
        self.children[(parent, name)] = node
        return node

    def directory(self, parts: tuple[str, ...], entry: str) -> int:
        """The node of the directory ``parts``, made (implied) where missing; refuses a path through a link or
        a file. One lookup for a directory already held, whatever its depth; else from the deepest one held."""
        node = self._dirs.get(parts)
        if node is not None:
            return node
        held = len(parts) - 1
        while held and parts[:held] not in self._dirs:
            held -= 1
        node = self._dirs[parts[:held]]
        for i in range(held, len(parts)):
            child = self.children.get((node, parts[i]))
            if child is None:
                child = self._new(node, parts[i], DIRECTORY)
            elif self.kind[child] != DIRECTORY:
                through = "/".join(parts[: i + 1])
                raise ArchiveError(f"{_show(entry)}: written through the {self.kind[child]} {_show(through)}")
            node = child
            self._dirs[parts[: i + 1]] = node
        return node

    def add(self, m: _Member) -> None:
        """``m`` in the tree, or ArchiveError (the root directory, or a directory again: nothing to add)."""
        if not m.parts:
            if m.kind == DIRECTORY:
                return
            raise ArchiveError(f"{_show(m.name)}: a {m.kind} in the place of the archive's own directory")
        parts = tuple(map(self._names.setdefault, m.parts, m.parts))
        parent = self.directory(parts[:-1], m.name)
        existing = self.children.get((parent, parts[-1]))
        if existing is not None:
            if m.kind == DIRECTORY == self.kind[existing]:
                return
            raise ArchiveError(f"{_show(m.name)}: a {m.kind} where the archive already has a {self.kind[existing]}")
        if m.kind == FILE:
            self.unpacked += m.size
            if self.unpacked > self.limits.max_unpacked_bytes:
                raise ArchiveError(
                    f"{_show(m.name)}: more than {self.limits.max_unpacked_bytes} bytes unpacked "
                    f"({self.unpacked} with this file of {m.size})"
                )
        node = self._new(parent, parts[-1], m.kind)
        if m.kind == DIRECTORY:
            self._dirs[parts] = node
        elif m.kind == LINK:
            self._link(node, m)

    def _link(self, node: int, m: _Member) -> None:
        target = m.target
        if not target:
            raise ArchiveError(f"{_show(m.name)}: link to nothing (an empty target)")
        if target.startswith("/") or _DRIVE.match(target):
            raise ArchiveError(f"{_show(m.name)}: link to an absolute path ({_show(target)})")
        if "\x00" in target:
            raise ArchiveError(f"{_show(m.name)}: invalid link target (NUL)")
        size = len(target) if target.isascii() else len(target.encode())
        if size > MAX_NAME_BYTES:
            raise ArchiveError(f"{_show(m.name)}: link target over {MAX_NAME_BYTES} bytes ({size})")
        if target.count("/") >= MAX_LINK_COMPONENTS:
            raise ArchiveError(f"{_show(m.name)}: link target of more than {MAX_LINK_COMPONENTS} components")
        self.link_bytes += size
        if self.link_bytes > MAX_LINK_BYTES_TOTAL:
            raise ArchiveError(f"{_show(m.name)}: link targets of more than {MAX_LINK_BYTES_TOTAL} bytes in all")
        self.targets[node] = target

    def resolve(self, link: int, memo: dict[int, tuple[int, int]], active: set[int]) -> tuple[int, int]:
        """Where ``link`` leads, as (node, depth below it of names the archive does not hold): each component of
        its target taken in turn from the link's directory, '..' to the parent (out of the root: refused), a link
        met on the way replaced by where it leads (memoised; at most MAX_LINK_LEVELS inside one another). Names the
        archive does not hold are followed lexically; the kernel would fail there instead, so this never keeps in
        a path that the kernel would take out."""
        if link in memo:
            return memo[link]
        if link in active:
            raise ArchiveError(f"{_show(self.path(link))}: link loop ({_show(self.targets[link])} leads back to it)")
        if len(active) >= MAX_LINK_LEVELS:
            raise ArchiveError(f"{_show(self.path(link))}: more than {MAX_LINK_LEVELS} links inside one another")
        active.add(link)
        target = self.targets[link]
        node, below = self.parent[link], 0
        through: int | None = None
        for part in target.split("/"):
            if not part or part == ".":
                continue
            if part == "..":
                if below:
                    below -= 1
                elif node == 0:
                    via = f" through the link {_show(self.path(through))}" if through is not None else ""
                    raise ArchiveError(f"{_show(self.path(link))}: link leaves the archive{via} ({_show(target)})")
                else:
                    node = self.parent[node]
            elif below:
                below += 1
            else:
                child = self.children.get((node, part))
                if child is None:
                    below = 1
                elif self.kind[child] == LINK:
                    node, below = self.resolve(child, memo, active)
                    through = child
                else:
                    node = child
        active.discard(link)
        memo[link] = (node, below)
        return node, below

    def finish(self) -> ArchiveSummary:
        if len(self.kind) == 1:
            raise ArchiveError("the archive is empty")
        memo: dict[int, tuple[int, int]] = {}
        for link in self.targets:
            self.resolve(link, memo, set())
        return ArchiveSummary(entries=len(self.kind) - 1, unpacked_bytes=self.unpacked)


# ------------------------------------------------------------------------------------------- check and unpack


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Writer:
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
                raise ArchiveError(f"{_show(entry)}: a link or a file is where a directory should be") from None
            raise
        return fd

    def file(self, m: _Member, reader: _TarReader) -> None:
        parent = self.directory(m.parts[:-1], m.name)
        try:
            fd = os.open(m.parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            raise ArchiveError(f"{_show(m.name)}: already exists") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ArchiveError(f"{_show(m.name)}: a link is in the way") from None
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
            raise ArchiveError(f"{_show(entry)}: already exists") from None


def _scan(
    fh: Readable, limits: ArchiveLimits, writer: _Writer | None = None, hasher: hashlib._Hash | None = None
) -> tuple[ArchiveSummary, list[_Member]]:
    """Read the whole archive (to its end-of-archive block), checking every member, creating it through
    ``writer`` if one is given (links excepted: returned, to be made last); the tree's resolution of links at the
    end."""
    tree = _Tree(limits)
    reader = _TarReader(_Inflater(fh, hasher), limits)
    links: list[_Member] = []
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
        return _scan(fh, limits)[0]


def check_stream(fh: Readable, limits: ArchiveLimits) -> ArchiveSummary:
    """``check`` of what ``fh.read`` returns (b"": the end), read only as far as the end-of-archive block."""
    return _scan(fh, limits)[0]


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
        writer = _Writer(root)
        try:
            hasher = hashlib.sha256()
            summary, links = _scan(fh, limits, writer, hasher)
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


EX_DATAERR = 65


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _digest(text: str) -> str:
    if re.fullmatch(DIGEST_PATTERN, text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a SHA-256 in lower-case hex")
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m core.code_archive extract --archive PATH --digest SHA256 --dest DIR --max-unpacked-bytes N
    --max-entries N`` (``--archive -``: the archive on standard input): prints {"entries": N, "unpacked_bytes": N}
    and exits 0; an archive that breaks a rule (a digest that does not match, a destination not empty): the
    reason on stderr, exit 65 (EX_DATAERR); anything else (bad arguments, I/O): exit 1."""
    parser = _Parser(prog="python -m core.code_archive", description="kiln's code archives")
    commands = parser.add_subparsers(dest="command", required=True)
    ex = commands.add_parser("extract", help="verify an archive and unpack it into an empty directory")
    ex.add_argument("--archive", required=True, help="the .tar.gz ('-': standard input)")
    ex.add_argument("--digest", type=_digest, required=True, help="its SHA-256 (hex)")
    ex.add_argument("--dest", type=Path, required=True, help="an empty directory (made if missing)")
    ex.add_argument("--max-unpacked-bytes", type=_count, required=True)
    ex.add_argument("--max-entries", type=_count, required=True)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or bad arguments (1)
        return exc.code if isinstance(exc.code, int) else 1
    limits = ArchiveLimits(max_unpacked_bytes=args.max_unpacked_bytes, max_entries=args.max_entries)
    try:
        if args.archive == "-":
            summary = extract_file(sys.stdin.buffer, args.digest, args.dest, limits)
        else:
            summary = extract(Path(args.archive), args.digest, args.dest, limits)
    except ArchiveError as exc:
        print(f"archive refused: {exc}", file=sys.stderr)
        return EX_DATAERR
    except Exception as exc:
        print(f"extract failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"entries": summary.entries, "unpacked_bytes": summary.unpacked_bytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
