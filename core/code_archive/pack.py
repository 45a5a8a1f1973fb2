"""Packing a directory as a reproducible archive (trusted data: the only place ``tarfile`` is used), with the
ignore files read as git reads them."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .base import (
    ALWAYS_IGNORED,
    DIRECTORY,
    FILE,
    IGNORE_FILES,
    LINK,
    ArchiveError,
    ArchiveLimits,
    ArchiveSummary,
    Member,
    path_parts,
)
from .tree import Tree

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
    tree = Tree(limits or ArchiveLimits(max_unpacked_bytes=sys.maxsize, max_entries=sys.maxsize))
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
                tree.add(Member(name, LINK, path_parts(name), 0, 0o777, target))
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mode = 0o777
                tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                tree.add(Member(name, DIRECTORY, path_parts(name), 0, 0o755, ""))
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                tree.add(Member(name, FILE, path_parts(name), st.st_size, info.mode, ""))
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                raise ArchiveError(f"{name}: not a regular file, directory or link (sockets, devices, FIFOs)")
    return tree.finish()


def pack_bytes(root: Path, limits: ArchiveLimits | None = None) -> tuple[bytes, ArchiveSummary]:
    buf = io.BytesIO()
    summary = pack(root, buf, limits)
    return buf.getvalue(), summary
