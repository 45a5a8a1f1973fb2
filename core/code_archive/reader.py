"""The streaming tar reader: gzip inflated a bounded step at a time, 512-byte headers parsed and checked here."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import struct
import zlib
from collections.abc import Iterator

from .base import (
    BLOCK,
    DIRECTORY,
    FILE,
    LINK,
    MAX_EXTENDED_BYTES,
    MAX_EXTENDED_TOTAL,
    MAX_GLOBAL_HEADERS,
    MAX_PAX_RECORDS,
    PAX_RECORDS_PER_ENTRY,
    ArchiveError,
    ArchiveLimits,
    Member,
    Readable,
    path_parts,
    show,
)

_IN_STEP = 64 << 10  # compressed bytes read at a time
OUT_STEP = 256 << 10  # the most one inflate step may produce
_ZERO_BLOCK = bytes(BLOCK)


class Inflater:
    """The tar stream inside the gzip stream of ``fh``, never more than ``OUT_STEP`` inflated at once, so that a
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
        """The next inflated bytes (at most OUT_STEP); b"" at the end of the last gzip member."""
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
            out = self._z.decompress(self._tail, OUT_STEP)
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
        """The next ``n`` bytes in pieces of at most OUT_STEP."""
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


_OCTAL = re.compile(rb" *([0-7]*) *")
_PAX_LENGTH = re.compile(rb"([0-9]{1,5}) ")
_DECIMAL = re.compile(rb"[0-9]{1,20}")


def _number(field: bytes, what: str, name: str) -> int:
    """A numeric header field: octal digits (NUL- or space-terminated) or GNU's base-256."""
    if field[0] & 0x80:
        if field[0] & 0x40:
            raise ArchiveError(f"{show(name)}: negative {what}")
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    match = _OCTAL.fullmatch(field.split(b"\0", 1)[0])
    if match is None:
        raise ArchiveError(f"{show(name)}: invalid {what} field in its header")
    return int(match.group(1) or b"0", 8)


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError(f"{show(raw.decode('utf-8', 'replace'))}: {what} is not UTF-8") from None


def _pax(data: bytes, name: str) -> dict[bytes, bytes]:
    """The records of a pax extended header ("%d %s=%s\\n", the length counting itself); later records win."""
    records: dict[bytes, bytes] = {}
    pos, n, count = 0, len(data), 0
    while pos < n:
        match = _PAX_LENGTH.match(data, pos)
        if match is None:
            if not data[pos:].strip(b"\0"):
                break
            raise ArchiveError(f"{show(name)}: malformed pax header")
        end = pos + int(match.group(1))
        if end <= match.end() or end > n or data[end - 1] != 0x0A:
            raise ArchiveError(f"{show(name)}: malformed pax header")
        key, eq, value = data[match.end() : end - 1].partition(b"=")
        if not eq or not key:
            raise ArchiveError(f"{show(name)}: malformed pax header")
        count += 1
        if count > MAX_PAX_RECORDS:
            raise ArchiveError(f"{show(name)}: pax header of more than {MAX_PAX_RECORDS} records")
        records[key] = value
        pos = end
    return records


@dataclasses.dataclass
class _Pending:
    """The extended headers read for the next entry: a pax header's records, a GNU long name and long link."""

    pax: dict[bytes, bytes] | None = None
    long_name: bytes | None = None
    long_link: bytes | None = None

    def any(self) -> bool:
        return self.pax is not None or self.long_name is not None or self.long_link is not None


def _entry_kind(kind: bytes, name: str, raw_link: bytes, size: int) -> str:
    """FILE, DIRECTORY or LINK for a header's type flag; every other type refused, and data where none belongs."""
    if kind in (b"0", b"\0", b"7"):
        entry = DIRECTORY if kind == b"\0" and name.endswith("/") else FILE  # V7 marks directories so
    elif kind == b"5":
        entry = DIRECTORY
    elif kind == b"2":
        entry = LINK
    elif kind == b"1":
        raise ArchiveError(f"{show(name)}: hard link (to {show(raw_link.decode('utf-8', 'replace'))})")
    elif kind in (b"3", b"4", b"6"):
        what = {b"3": "character device", b"4": "block device", b"6": "FIFO"}[kind]
        raise ArchiveError(f"{show(name)}: device or FIFO ({what})")
    else:
        raise ArchiveError(f"{show(name)}: unsupported entry type {kind!r}")
    if entry == FILE and name.endswith("/"):
        raise ArchiveError(f"{show(name)}: a file whose name ends in '/'")
    if entry != FILE and size:
        raise ArchiveError(f"{show(name)}: a {entry} with {size} bytes of data")
    return entry


class TarReader:
    """The members of the tar stream of ``src``, each checked as a header before its data is read: what
    ``members`` yields has a type kiln accepts, a checked name and a size; the caller either copies its data
    (``copy_data``) or leaves it, and the reader skips what is left before the next header."""

    def __init__(self, src: Inflater, limits: ArchiveLimits) -> None:
        self.src = src
        self.limits = limits
        self.members_read = 0
        self.pax_records = 0
        self.extended_bytes = 0
        self.global_headers = 0
        self._left = 0  # data of the current member not yet read
        self._pending = _Pending()

    def _extended(self, kind: bytes, size: int, name: str) -> bytes:
        what = {b"x": "pax header", b"g": "pax global header", b"L": "long name", b"K": "long link name"}[kind]
        if size > MAX_EXTENDED_BYTES:
            raise ArchiveError(f"{show(name)}: {what} of {size} bytes (the limit is {MAX_EXTENDED_BYTES})")
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
            raise ArchiveError(f"{show(name)}: sparse file")
        return records

    def members(self) -> Iterator[Member]:
        self._pending = _Pending()
        while True:
            block = self.src.read(BLOCK, eof_ok=True, what="a header")
            if not block or block == _ZERO_BLOCK:  # the end of the archive (or of the stream, at a boundary)
                if self._pending.any():
                    raise ArchiveError("the archive ends after an extended header")
                return
            raw_name = block[:100].split(b"\0", 1)[0]
            shown = raw_name.decode("utf-8", "replace")
            stored = _number(block[148:156], "checksum", shown)
            if stored != sum(block) - sum(block[148:156]) + 256 and stored != sum(_SIGNED.unpack(block)) + 256:
                raise ArchiveError(f"{show(shown)}: bad header checksum (not a tar archive?)")
            kind = block[156:157]
            size = _number(block[124:136], "size", shown)
            if kind in (b"x", b"g", b"L", b"K"):
                self._take_extended(kind, self._extended(kind, size, shown), shown)
                continue
            raw_name, raw_link, size = self._apply_extended(block, raw_name, shown, size)
            name = _text(raw_name, "the name")
            self.members_read += 1
            if self.members_read > self.limits.max_entries:
                raise ArchiveError(f"more than {self.limits.max_entries} entries")
            entry = _entry_kind(kind, name, raw_link, size)
            mode = _number(block[100:108], "mode", name)
            target = _text(raw_link, "the link's target") if entry == LINK else ""
            self._left = size
            yield Member(name, entry, path_parts(name), size, mode, target)
            if self._left:
                self.src.skip(self._left)
            self.src.skip(-size % BLOCK)
            self._left = 0

    def _take_extended(self, kind: bytes, data: bytes, shown: str) -> None:
        """Keep an extended header for the entry after it (a global one is only checked)."""
        pending = self._pending
        if kind == b"g":
            self.global_headers += 1
            if self.global_headers > MAX_GLOBAL_HEADERS:
                raise ArchiveError(f"more than {MAX_GLOBAL_HEADERS} pax global headers")
            overrides = {b"path", b"linkpath", b"size"} & self._records(data, shown).keys()
            if overrides:
                keys = ", ".join(sorted(k.decode() for k in overrides))
                raise ArchiveError(f"{show(shown)}: a pax global header that sets {keys}")
        elif kind == b"x":
            if pending.pax is not None:
                raise ArchiveError(f"{show(shown)}: two pax headers for one entry")
            pending.pax = self._records(data, shown)
        elif kind == b"L":
            if pending.long_name is not None:
                raise ArchiveError(f"{show(shown)}: two long names for one entry")
            pending.long_name = data.split(b"\0", 1)[0]
        else:
            if pending.long_link is not None:
                raise ArchiveError(f"{show(shown)}: two long link names for one entry")
            pending.long_link = data.split(b"\0", 1)[0]

    def _apply_extended(self, block: bytes, raw_name: bytes, shown: str, size: int) -> tuple[bytes, bytes, int]:
        """The entry's name, link target and size once the extended headers before it override its header's;
        those headers are used up."""
        pax, long_name, long_link = self._pending.pax, self._pending.long_name, self._pending.long_link
        if pax is not None and b"path" in pax:
            if long_name is not None:
                raise ArchiveError(f"{show(shown)}: both a pax path and a GNU long name")
            raw_name = pax[b"path"]
        elif long_name is not None:
            raw_name = long_name
        elif block[257:263] == b"ustar\x00" and block[345] != 0:  # POSIX ustar: a prefix before the name
            raw_name = block[345:500].split(b"\0", 1)[0] + b"/" + raw_name
        raw_link = block[157:257].split(b"\0", 1)[0]
        if pax is not None and b"linkpath" in pax:
            if long_link is not None:
                raise ArchiveError(f"{show(shown)}: both a pax linkpath and a GNU long link name")
            raw_link = pax[b"linkpath"]
        elif long_link is not None:
            raw_link = long_link
        if pax is not None and b"size" in pax:
            if _DECIMAL.fullmatch(pax[b"size"]) is None:
                raise ArchiveError(f"{show(shown)}: invalid size in its pax header")
            size = int(pax[b"size"])
        self._pending = _Pending()
        return raw_name, raw_link, size

    def copy_data(self, fd: int) -> None:
        """Write the current member's data to ``fd``."""
        for piece in self.src.pieces(self._left):
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view) :]
        self._left = 0


_SIGNED = struct.Struct("148b8x356b")  # the header less its checksum field, as signed bytes (old tars summed so)
