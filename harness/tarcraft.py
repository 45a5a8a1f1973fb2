"""Hostile tar archives, built byte by byte or with tarfile (writing, which trusts its input), for the tests of
``core.code_archive`` and its bench. Nothing is downloaded: each archive is generated where it is used.

``header`` writes any ustar header (any type, size or name, a right or wrong checksum), ``pax`` and ``gnu_long``
the extended headers before it, ``bomb`` a gzip stream that inflates to far more than it weighs without ever
holding that much in memory (a deflate segment of zeros, flushed so that it stands alone, repeated)."""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Callable, Iterable

BLOCK = 512
END = bytes(2 * BLOCK)


def _octal(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode() + b"\0"


def header(
    name: bytes | str,
    kind: bytes = b"0",
    size: int = 0,
    link: bytes | str = b"",
    mode: int = 0o644,
    prefix: bytes = b"",
    checksum: int | None = None,
    base256_size: bool = False,
) -> bytes:
    """One 512-byte POSIX ustar header; names longer than the fields are cut (put them in a pax header)."""
    name = name.encode() if isinstance(name, str) else name
    link = link.encode() if isinstance(link, str) else link
    block = bytearray(BLOCK)
    block[0:100] = name[:100].ljust(100, b"\0")
    block[100:108] = _octal(mode, 8)
    block[108:116] = _octal(0, 8)
    block[116:124] = _octal(0, 8)
    if base256_size or size >= 8**11:
        block[124:136] = b"\x80" + size.to_bytes(11, "big")
    else:
        block[124:136] = _octal(size, 12)
    block[136:148] = _octal(0, 12)
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[157:257] = link[:100].ljust(100, b"\0")
    block[257:265] = b"ustar\x0000"
    block[345:500] = prefix[:155].ljust(155, b"\0")
    total = sum(block) if checksum is None else checksum
    block[148:156] = f"{total:06o}".encode() + b"\0 "
    return bytes(block)


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: bytes | str, data: bytes = b"", kind: bytes = b"0", link: bytes | str = b"", **kw: object) -> bytes:
    """A header and its data, padded to the block."""
    return header(name, kind, len(data), link, **kw) + pad(data)  # type: ignore[arg-type]


def pax_records(records: Iterable[tuple[str, str | bytes]]) -> bytes:
    out = b""
    for key, value in records:
        body = f" {key}=".encode() + (value.encode() if isinstance(value, str) else value) + b"\n"
        n = len(body) + 1
        while len(str(n)) + len(body) != n:
            n = len(str(n)) + len(body)
        out += str(n).encode() + body
    return out


def pax(records: Iterable[tuple[str, str | bytes]], kind: bytes = b"x", declared: int | None = None) -> bytes:
    """A pax extended header ('x', or 'g' for a global one) with ``records``; ``declared`` overrides its size."""
    data = pax_records(records)
    size = len(data) if declared is None else declared
    return header(b"././@PaxHeader", kind, size) + pad(data)


def gnu_long(value: bytes, kind: bytes = b"L") -> bytes:
    """A GNU long name ('L') or long link name ('K') header and its data."""
    data = value + b"\0"
    return header(b"././@LongLink", kind, len(data)) + pad(data)


def gz(raw: bytes) -> bytes:
    return gzip.compress(raw, compresslevel=6, mtime=0)


def bomb(prefix: bytes, zeros: int, suffix: bytes = b"", segment: int = 1 << 20) -> bytes:
    """gzip of ``prefix``, then ``zeros`` zero bytes (rounded down to ``segment``), then ``suffix``: the zeros
    cost about 1 KiB per MiB (deflate's limit), built from one flushed segment repeated. The trailer's CRC is
    not the stream's (nothing inflates that far)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = z.compress(prefix) + z.flush(zlib.Z_FULL_FLUSH)
    one = z.compress(bytes(segment)) + z.flush(zlib.Z_FULL_FLUSH)
    tail = z.compress(suffix) + z.flush(zlib.Z_FINISH)
    return head + one * (zeros // segment) + tail


def tar_gz(*infos: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """An archive written by tarfile from ``(TarInfo, data)`` pairs (data None: no data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        for info, data in infos:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def entry(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes | None = None, mode: int | None = None
) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    if mode is not None:
        info.mode = mode
    if kind == tarfile.REGTYPE and data is None:
        data = b"print('pwned')\n"
    return info, data


def cve_2025_4517(
    component: int,
    steps: str = "abcdefghijklmnop",
    through_links: bool = True,
    hard_link: bool = False,
    payload: str = "escape/newfile",
) -> bytes:
    """The shape of CPython's test for CVE-2025-4517 (test_realpath_limit_attack): directories of ``component``
    characters nested through a chain of links (``a -> ddd``, ``ddd/b -> ddd``, ...), so that the resolved path
    outgrows PATH_MAX and os.path.realpath stops resolving; a link at the end of the chain back up by as many
    levels, ``escape`` one level above that, then a file written through ``escape`` (and, with ``hard_link``, a
    hard link to a file outside, then written). ``through_links``: each directory named through the links before
    it (``a/b/ddd``: short names, as an attacker would); else by its resolved path (``ddd/ddd/ddd``), as CPython's
    test does."""
    comp = "d" * component
    infos = []
    named = resolved = ""
    for step in steps:
        infos.append(entry(f"{named}{comp}", tarfile.DIRTYPE, mode=0o777))
        infos.append(entry(f"{named}{step}", tarfile.SYMTYPE, comp))
        named = f"{named}{step}/" if through_links else f"{named}{comp}/"
        resolved += f"{step}/"
    linkpath = resolved + "l" * 254
    infos.append(entry(linkpath, tarfile.SYMTYPE, "/".join([".."] * len(steps))))
    infos.append(entry("escape", tarfile.SYMTYPE, linkpath + "/.."))
    if hard_link:
        infos.append(entry("flaglink", tarfile.LNKTYPE, "escape/flag"))
        infos.append(entry("flaglink", data=b"overwrite"))
    infos.append(entry(payload, data=b"import os; os.system('id > /tmp/kiln-pwned')\n"))
    return tar_gz(*infos)


def honest_zeros(files: int, each_mib: int, after: bytes = b"") -> bytes:
    """``files`` files of ``each_mib`` MiB of zeros under true headers, then ``after``: a checker must inflate
    every byte to reach what follows."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = []
    for i in range(files):
        out.append(z.compress(header(f"zeros{i}", size=each_mib << 20)))
        out.extend(z.compress(bytes(1 << 20)) for _ in range(each_mib))
    out.append(z.compress(after + END) + z.flush())
    return b"".join(out)


def literal_coded(size: int, after: bytes) -> bytes:
    """One file of ``size`` bytes that deflate codes as literals only (Huffman, about a bit a byte): inflate's
    slowest output per compressed byte (500 MiB in about 62 MiB); then ``after``."""
    data = bytearray(b"A" * size)
    data[::4099] = b"B" * len(data[::4099])
    z = zlib.compressobj(9, zlib.DEFLATED, 31, 9, zlib.Z_HUFFMAN_ONLY)
    return z.compress(header("literals", size=size)) + z.compress(bytes(data)) + z.compress(after + END) + z.flush()


def deep_alternating(entries: int) -> bytes:
    """``entries`` files at depth 64 under two 62-deep directories, alternately, each with a pax path: every entry
    misses a reader's cache of the last directory and walks all 64 components."""
    chain = "/".join(["d" * 14] * 62)
    parts = []
    for i in range(entries):
        name = f"{chain}/{'ab'[i % 2]}/f{i}"
        parts.append(pax([("path", name)]) + header(name[:99]))
    return gz(b"".join(parts) + END)


def deep_directories(entries: int) -> bytes:
    """``entries`` directories, all but a chain of 63 at depth 64, each named in full by a pax path: the most
    directory paths of the most components a checker may have to hold."""
    chain = "/".join(["d" * 14] * 63)
    parts = [pax([("path", f"{chain}/x{i}")]) + header(f"x{i}", kind=b"5") for i in range(entries - 63)]
    return gz(b"".join(parts) + END)


def many_links(link_bytes: int) -> bytes:
    """Links whose targets walk down and up a directory ('d/../' repeated: 101 components, 255 bytes), up to
    ``link_bytes`` of targets in all, then a chain of 39 links through one another."""
    parts = [member("d", kind=b"5")]
    target = "d/.." + "/d/.." * 50
    for i in range(link_bytes // len(target)):
        parts.append(pax([("linkpath", target)]) + header(f"l{i}", kind=b"2"))
    for i in range(1, 40):
        parts.append(header(f"c{i}", kind=b"2", link=f"c{i - 1}" if i > 1 else "d"))
    return gz(b"".join(parts) + END)


def tiny_entries(n: int) -> bytes:
    return gz(b"".join(header(f"f{i}") for i in range(n)) + END)


def with_ok(*infos: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """A harmless file first, then ``infos``: what is refused is refused for what follows."""
    return tar_gz(entry("ok.py", data=b"x = 1\n"), *infos)


R, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
Build = Callable[[], bytes]


def hostile(site_packages: str, full: bool) -> dict[str, tuple[Build, str]]:
    """Every hostile archive of the acceptance list: name -> (what builds the .tar.gz, a regex the refusal's
    message matches; each is an archive rule, 422 from the API). ``full``: the resource attacks at the API's
    default limits (64 MiB upload, 512 MiB unpacked, 20,000 entries; up to 64 MiB of gzip each); else small, for
    ``SMALL_LIMITS`` (32 MiB unpacked, 1,000 entries)."""
    big = 64_000 << 20 if full else 1 << 30  # 62.5 GiB of zeros in 63.3 MiB of gzip, if full
    entries = 20_000 if full else 1_000
    mib = 1 if full else 16  # resource attacks shrunk with the limits
    pth = b"import os; os.system('id > /tmp/kiln-pwned')\n"
    up = (entry("sub", D), entry("sub/up", S, ".."))
    return {
        # CVE-2025-4517 (os.path.realpath stops resolving past PATH_MAX) and CVE-2024-12718 (hard links) shapes
        "cve-2025-4517 through links": (lambda: cve_2025_4517(236), "written through the link 'a'"),
        "cve-2025-4517 with a hard link": (lambda: cve_2025_4517(236, hard_link=True), "written through the link"),
        "cve-2025-4517 as cpython's test": (lambda: cve_2025_4517(236, through_links=False), "name over 1024 bytes"),
        "hard link to an escaping link": (
            lambda: with_ok(*up, entry("esc", S, "sub/up/.."), entry("h", H, "esc/x")),
            "'h': hard link",
        ),
        "hard link": (lambda: with_ok(entry("h", H, "ok.py")), "hard link"),
        "link leaves through a link": (
            lambda: with_ok(*up, entry("x", S, "sub/up/..")),
            "'x': link leaves the archive through the link 'sub/up'",
        ),
        "link leaves through a later link": (
            lambda: with_ok(entry("x", S, "sub/up/../etc"), *up),
            "'x': link leaves the archive through the link 'sub/up'",
        ),
        "chain of links leaves": (
            lambda: with_ok(
                entry("d1/d2/d3", D),
                entry("l3", S, "d1/d2/d3"),
                entry("d1/d2/d3/u", S, "../../.."),
                entry("d1/l2", S, "../l3/u"),
                entry("e", S, "d1/l2/.."),
            ),
            "'e': link leaves the archive through the link 'd1/l2'",
        ),
        "file written through a link to a directory": (
            lambda: with_ok(entry("sub", D), entry("d", S, "sub"), entry("d/evil.py")),
            "'d/evil.py': written through the link 'd'",
        ),
        "file written through a link that leaves": (
            lambda: with_ok(entry("d", S, "../../../../tmp"), entry("d/evil.py")),
            "written through the link 'd'",
        ),
        "link to an absolute path": (lambda: with_ok(entry("cfg", S, "/etc/passwd")), "link to an absolute path"),
        "link loop": (lambda: with_ok(entry("a", S, "b/x"), entry("b", S, "a")), "link loop"),
        "absolute path": (lambda: with_ok(entry("/tmp/kiln-absolute-escape.py")), "absolute path"),
        "traversal": (lambda: with_ok(entry("a/../../escaped.py")), r"leaves the archive \('\.\.'\)"),
        "character device": (lambda: with_ok(entry("null", tarfile.CHRTYPE)), "device or FIFO"),
        "block device": (lambda: with_ok(entry("sda", tarfile.BLKTYPE)), "device or FIFO"),
        "fifo": (lambda: with_ok(entry("pipe", tarfile.FIFOTYPE)), "device or FIFO"),
        "pth into site-packages (relative)": (
            lambda: with_ok(entry("../../.venv/lib/python3.11/site-packages/kiln-pwned.pth", data=pth)),
            r"leaves the archive \('\.\.'\)",
        ),
        "pth into site-packages (absolute)": (
            lambda: with_ok(entry(f"{site_packages}/kiln-pwned.pth", data=pth)),
            "absolute path",
        ),
        "pth through a link to site-packages": (
            lambda: with_ok(entry("sp", S, site_packages), entry("sp/kiln-pwned.pth", data=pth)),
            "link to an absolute path",
        ),
        "gzip of zeros only": (lambda: bomb(b"", big), "the archive is empty"),
        "header claims 64 GiB": (lambda: bomb(header("big", size=64 << 30), big), "'big': more than .* bytes unpacked"),
        "small bomb over the unpacked limit": (
            lambda: bomb(header("big", size=(600 << 20) // mib), 1 << 20),
            "'big': more than .* bytes unpacked",
        ),
        "honest headers over the unpacked limit": (
            lambda: honest_zeros(6, 100 // mib),
            "'zeros5': more than .* bytes unpacked",
        ),
        "literal-coded data, then an absolute path": (
            lambda: literal_coded((500 << 20) // mib, member("/etc/cron.d/kiln", b"x")),
            "absolute path",
        ),
        "pax header claiming 1 GiB": (
            lambda: bomb(header(b"././@PaxHeader", b"x", 1 << 30), 1 << 30),
            r"pax header of 1073741824 bytes \(the limit is 8192\)",
        ),
        "pax header of 4 MiB": (
            lambda: gz(pax([("path", "x" * (4 << 20))]) + member("f", b"x") + END),
            "pax header of 4194318 bytes",
        ),
        "pax header of digits (tarfile's ReDoS)": (
            lambda: gz(header(b"././@PaxHeader", b"x", 512 << 10) + b"1" * (512 << 10) + member("f", b"x") + END),
            "pax header of 524288 bytes",
        ),
        "GNU long name of 1 MiB": (
            lambda: gz(gnu_long(b"a" * (1 << 20)) + member("f", b"x") + END),
            "long name of 1048577 bytes",
        ),
        "GNU long name claiming 1 GiB": (
            lambda: bomb(header(b"././@LongLink", b"L", 1 << 30), 1 << 30),
            "long name of 1073741824 bytes",
        ),
        "many pax records": (
            lambda: gz(pax([("a", "")] * 500) + member("f", b"x") + END),
            "pax header of more than 64 records",
        ),
        "too many entries": (lambda: tiny_entries(entries + 1), f"more than {entries} entries"),
        "deep nesting": (lambda: gz(pax([("path", "/".join(["a"] * 65))]) + member("f") + END), "more than 64 levels"),
        "deep entries defeat the cache": (lambda: deep_alternating(entries + 1), f"more than {entries} entries"),
        "deep directories": (lambda: deep_directories(entries + 1), f"more than {entries} entries"),
        "bad checksum": (lambda: gz(header("f", checksum=1) + END), "bad header checksum"),
        "not a tar": (lambda: gz(b"just some text\n"), "not a readable .tar.gz"),
        "not gzip": (lambda: b"PK\x03\x04 not a tarball", "not a readable .tar.gz"),
    }
