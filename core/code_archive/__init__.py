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
below: gzip inflated at most ``reader.OUT_STEP`` bytes at a time, 512-byte headers parsed here (checksum included),
pax and GNU long-name headers accepted up to ``MAX_EXTENDED_BYTES``, and every entry's path and every link's
target resolved through the links of the archive itself (``tree.Tree``), never through the file system. The work is
bounded by the limits: inflated bytes by the unpacked limit plus the headers' (each counted before it is read),
Python work per entry by the caps on names, depth, links and records. The worker (``extract``; as a command, ``python
-m core.code_archive extract``) checks everything again while it creates each entry itself under the destination,
walking every path one component at a time with ``O_NOFOLLOW`` from the destination's descriptor, files with
``O_EXCL``, modes 0644/0755, and the links last, once nothing else is left to write, so no write goes through a link.
Only the standard library runs on that path (``pack`` alone imports ``tarfile``, for trusted data).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .base import (
    ALWAYS_IGNORED,
    CHUNK,
    DIGEST_PATTERN,
    DIRECTORY,
    FILE,
    IGNORE_FILES,
    LINK,
    ArchiveError,
    ArchiveLimits,
    ArchiveSummary,
    Readable,
)
from .command import EX_DATAERR, main
from .pack import IgnoreRules, pack, pack_bytes
from .unpack import check, check_stream, extract, extract_file

__all__ = [
    "ALWAYS_IGNORED",
    "DIGEST_PATTERN",
    "DIRECTORY",
    "EX_DATAERR",
    "FILE",
    "IGNORE_FILES",
    "LINK",
    "ArchiveError",
    "ArchiveLimits",
    "ArchiveSummary",
    "IgnoreRules",
    "Readable",
    "artifact_path",
    "check",
    "check_stream",
    "extract",
    "extract_file",
    "main",
    "pack",
    "pack_bytes",
    "sha256_of",
]

# ---------------------------------------------------------------------------------------- the artifact store


def artifact_path(storage: Path, team_id: int, digest: str) -> Path:
    """Where the artifact store keeps a team's archive (the API writes it, workers read it)."""
    return storage / "artifacts" / str(team_id) / f"{digest}.tar.gz"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
