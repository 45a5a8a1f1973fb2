"""A user's code as one archive: packed by the CLI, checked by the API, unpacked by the worker.

The archive is a gzipped tar whose bytes depend only on the files' paths, contents and executable bits (sorted
entries, zero times and owners, gzip without a timestamp), so its SHA-256 names the code: a second ``kiln submit
--workdir`` of unchanged code finds the digest already stored and sends nothing.

What an archive may hold: regular files, directories and symbolic links that stay inside it. Absolute paths,
``..`` components, links that leave the archive, hard links, devices and FIFOs are refused, and so is an archive
over its limits (bytes unpacked, entries). The API checks before it stores anything; the worker checks the
stored archive's digest and contents again before it unpacks (with tarfile's ``data`` filter on top).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import posixpath
import re
import stat
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

DIGEST_PATTERN = r"^[0-9a-f]{64}$"
IGNORE_FILES = (".gitignore", ".kilnignore")
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".kiln/", ".venv/")
CHUNK = 1 << 20


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
    root = root.resolve()
    if not root.is_dir():
        raise ArchiveError(f"{root} is not a directory")
    entries = 0
    unpacked = 0
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
                _check_link(name, target)
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mode = 0o777
                tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                unpacked += st.st_size
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                raise ArchiveError(f"{name}: not a regular file, directory or link (sockets, devices, FIFOs)")
            entries += 1
            if limits is not None:
                _check_limits(entries, unpacked, limits)
    return ArchiveSummary(entries=entries, unpacked_bytes=unpacked)


def pack_bytes(root: Path, limits: ArchiveLimits | None = None) -> tuple[bytes, ArchiveSummary]:
    buf = io.BytesIO()
    summary = pack(root, buf, limits)
    return buf.getvalue(), summary


# -------------------------------------------------------------------------------------------------- checking


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_name(name: str) -> None:
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or "\\" in name:
        raise ArchiveError(f"{name!r}: absolute path")
    if any(part == ".." for part in name.split("/")):
        raise ArchiveError(f"{name!r}: path leaves the archive ('..')")
    if "\x00" in name or len(name) > 1024:
        raise ArchiveError(f"{name[:80]!r}: invalid name")


def _check_link(name: str, target: str) -> None:
    if target.startswith("/"):
        raise ArchiveError(f"{name!r}: link to an absolute path ({target!r})")
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if joined == ".." or joined.startswith("../"):
        raise ArchiveError(f"{name!r}: link leaves the archive ({target!r})")


def _check_limits(entries: int, unpacked: int, limits: ArchiveLimits) -> None:
    if entries > limits.max_entries:
        raise ArchiveError(f"more than {limits.max_entries} entries")
    if unpacked > limits.max_unpacked_bytes:
        raise ArchiveError(f"more than {limits.max_unpacked_bytes} bytes unpacked")


def check(path: Path, limits: ArchiveLimits) -> ArchiveSummary:
    """Every entry of the .tar.gz at ``path`` against the rules above; raises ArchiveError."""
    entries = 0
    unpacked = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for info in tar:
                _check_name(info.name)
                if info.issym():
                    _check_link(info.name, info.linkname)
                elif info.islnk():
                    raise ArchiveError(f"{info.name!r}: hard link")
                elif info.isdev() or info.isfifo():
                    raise ArchiveError(f"{info.name!r}: device or FIFO")
                elif not (info.isreg() or info.isdir()):
                    raise ArchiveError(f"{info.name!r}: unsupported entry type")
                entries += 1
                unpacked += info.size if info.isreg() else 0
                _check_limits(entries, unpacked, limits)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ArchiveError(f"not a readable .tar.gz: {exc}") from None
    if entries == 0:
        raise ArchiveError("the archive is empty")
    return ArchiveSummary(entries=entries, unpacked_bytes=unpacked)


def extract(path: Path, digest: str, dest: Path, limits: ArchiveLimits) -> ArchiveSummary:
    """Verify the archive's digest and entries, then unpack it into the empty directory ``dest``."""
    actual = sha256_of(path)
    if actual != digest:
        raise ArchiveError(f"archive {digest[:12]} does not match its digest (found {actual[:12]})")
    summary = check(path, limits)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ArchiveError(f"{dest} is not empty")
    with tarfile.open(path, mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
    return summary
