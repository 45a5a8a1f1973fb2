"""The archive reader of ``core.code_archive`` (issue 38): tar headers parsed by kiln itself over a bounded gzip
stream, links resolved through the archive's own links, and the worker's unpacking that never writes through a
link. Every hostile shape of the acceptance list is refused here by ``check`` and ``extract`` at small limits (the
API's answer at full size is tests/security/test_hostile_archives.py); what is accepted unpacks to what was
packed. No process is started: the command's contract is tested through ``main``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from core import code_archive as ca
from core.code_archive import FILE, ArchiveError, ArchiveLimits, check, extract, pack_bytes
from core.code_archive import tree as archive_tree
from core.code_archive.base import Member
from core.code_archive.reader import OUT_STEP, Inflater, TarReader
from core.code_archive.unpack import Writer
from harness import tarcraft as tc
from harness.tarcraft import D, H, S, entry

ROOT = Path(__file__).resolve().parents[2]
SMALL = ArchiveLimits(max_unpacked_bytes=32 << 20, max_entries=1000)
SITE_PACKAGES = f"{sys.prefix}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
HOSTILE = tc.hostile(SITE_PACKAGES, full=False)


def write(tmp_path: Path, blob: bytes, name: str = "a.tar.gz") -> Path:
    path = tmp_path / name
    path.write_bytes(blob)
    return path


def everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ------------------------------------------------------------------------------------------ hostile archives


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_check_refuses_every_hostile_archive(tmp_path: Path, case: str) -> None:
    build, why = HOSTILE[case]
    with pytest.raises(ArchiveError, match=why):
        check(write(tmp_path, build()), SMALL)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_extract_refuses_them_too_and_writes_nothing_outside(tmp_path: Path, case: str) -> None:
    build, why = HOSTILE[case]
    box = tmp_path / "box"  # what the sandbox would see: the archive and the destination
    box.mkdir()
    blob = build()
    archive = write(box, blob)
    with pytest.raises(ArchiveError, match=why):
        extract(archive, hashlib.sha256(blob).hexdigest(), box / "dest", SMALL)
    assert sorted(p.name for p in box.iterdir()) == ["a.tar.gz", "dest"]
    assert not any(p.is_symlink() for p in (box / "dest").rglob("*"))  # links are made last, after every check
    assert not Path(f"{SITE_PACKAGES}/kiln-pwned.pth").exists()
    assert not Path("/tmp/kiln-absolute-escape.py").exists()


def test_the_cve_2025_4517_shape_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """On this interpreter (3.11.7) tarfile's data filter let this very archive write ``newfile`` beside the
    destination; here the first directory named through a link stops it."""
    dest = tmp_path / "dest"
    blob = tc.cve_2025_4517((4096 - len(str(dest)) - 1) // 17)
    archive = write(tmp_path, blob)
    with pytest.raises(ArchiveError, match=r"'a/d+'\.\.\. \(\d+ characters\): written through the link 'a'"):
        extract(archive, hashlib.sha256(blob).hexdigest(), dest, SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.gz", "dest"]
    assert [p.name for p in dest.iterdir()] == ["d" * ((4096 - len(str(dest)) - 1) // 17)]


# ------------------------------------------------------------------------------------------------ the reader


def test_the_clis_packing_of_the_examples_reads_as_tarfile_reads_it(tmp_path: Path) -> None:
    for example in ("digits", "digits-script"):
        blob, packed = pack_bytes(ROOT / "examples" / example)
        summary = check(write(tmp_path, blob), SMALL)
        assert summary == packed
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            members = tar.getmembers()
        assert summary.entries == len(members)
        assert summary.unpacked_bytes == sum(m.size for m in members if m.isreg())


def test_pack_check_extract_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "m.py").write_text("x = 1\n")
    (src / "pkg" / "deep" / "d.py").write_text("y = 2\n" * 1000)
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o4775)  # setuid and group-writable: unpacked 0755
    (src / "pkg" / "alias").symlink_to("deep")
    (src / "pkg" / "up").symlink_to("../m.py")
    (src / "dangling").symlink_to("not/there/yet")
    blob, packed = pack_bytes(src)
    archive = write(tmp_path, blob)
    assert check(archive, SMALL) == packed
    dest = tmp_path / "dest"
    assert extract(archive, hashlib.sha256(blob).hexdigest(), dest, SMALL) == packed
    assert (dest / "pkg" / "alias" / "d.py").read_text() == "y = 2\n" * 1000
    assert (dest / "pkg" / "up").read_text() == "x = 1\n"
    assert os.readlink(dest / "dangling") == "not/there/yet"
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "m.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "pkg").stat().st_mode) == 0o755
    assert {p.stat(follow_symlinks=False).st_uid for p in dest.rglob("*")} == {os.getuid()}


def test_modes_are_sanitized_and_no_owner_is_set(tmp_path: Path) -> None:
    blob = tc.gz(
        tc.header("d", b"5", mode=0o7777)
        + tc.member("d/suid", b"#!/bin/sh\n", mode=0o6755)
        + tc.member("d/sticky", b"x", mode=0o1666)
        + tc.END
    )
    dest = tmp_path / "dest"
    extract(write(tmp_path, blob), hashlib.sha256(blob).hexdigest(), dest, SMALL)
    assert stat.S_IMODE((dest / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "d" / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "d" / "sticky").stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("raw", "entries"),
    [
        (tc.header("f", prefix=b"dir/sub") + tc.END, ["dir", "dir/sub", "dir/sub/f"]),  # ustar prefix
        (tc.header("d/", kind=b"\0") + tc.member("d/f", b"1") + tc.END, ["d", "d/f"]),  # V7 directory
        (tc.pax([("path", "long/" + "n" * 200)]) + tc.header("cut") + tc.END, ["long", "long/" + "n" * 200]),
        (tc.gnu_long(b"gnu/" + b"n" * 200) + tc.header("cut") + tc.END, ["gnu", "gnu/" + "n" * 200]),
        (tc.gnu_long(b"t" * 150, b"K") + tc.header("l", b"2", link="cut") + tc.END, ["l"]),
        (tc.pax([("comment", "git archive's commit")], kind=b"g") + tc.member("f", b"1") + tc.END, ["f"]),
        (tc.member("./", kind=b"5") + tc.member("./f", b"1") + tc.END, ["f"]),  # tar czf x.tgz .
        (tc.member("f", b"1") + tc.header("f2", base256_size=True) + tc.END, ["f", "f2"]),
        (tc.member("f", b"1") + tc.END + b"anything after the end is never read", ["f"]),
        (tc.member("f", b"1"), ["f"]),  # no end-of-archive blocks: the stream's end at a header boundary
    ],
)
def test_the_tar_dialects_kiln_accepts(tmp_path: Path, raw: bytes, entries: list[str]) -> None:
    blob = tc.gz(raw)
    dest = tmp_path / "dest"
    summary = extract(write(tmp_path, blob), hashlib.sha256(blob).hexdigest(), dest, SMALL)
    assert sorted(everything_under(dest)) == sorted(entries)
    assert summary.entries == len(entries)


def test_a_long_link_target_reaches_the_link(tmp_path: Path) -> None:
    target = "/".join(["x"] * 60) + "/" + "t" * 30
    raw = tc.gnu_long(target.encode(), b"K") + tc.header("l", b"2", link="cut") + tc.END
    blob = tc.gz(raw)
    dest = tmp_path / "dest"
    extract(write(tmp_path, blob), hashlib.sha256(blob).hexdigest(), dest, SMALL)
    assert os.readlink(dest / "l") == target


def test_a_tar_split_over_gzip_members_is_one_stream(tmp_path: Path) -> None:
    raw = tc.member("a.py", b"a" * 700) + tc.member("b.py", b"b") + tc.END
    blob = tc.gz(raw[:600]) + b"\0" * 10 + tc.gz(raw[600:])
    assert check(write(tmp_path, blob), SMALL) == ca.ArchiveSummary(entries=2, unpacked_bytes=701)


def test_a_signed_checksum_is_accepted_and_a_wrong_one_is_not(tmp_path: Path) -> None:
    block = bytearray(tc.header("\xe9t\xe9.py".encode()))  # bytes over 127: signed and unsigned sums differ
    signed = sum(b - 256 if b > 127 else b for b in block[:148] + block[156:]) + 256
    block[148:156] = f"{signed:06o}".encode() + b"\0 "
    assert check(write(tmp_path, tc.gz(bytes(block) + tc.END)), SMALL).entries == 1
    block[148:156] = f"{signed + 1:06o}".encode() + b"\0 "
    with pytest.raises(ArchiveError, match="'été.py': bad header checksum"):
        check(write(tmp_path, tc.gz(bytes(block) + tc.END)), SMALL)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (tc.header("f", size=10) + b"x" * 100, "ends inside an entry"),
        (tc.header("f")[:300], "ends inside a header"),
        (tc.pax([("path", "x")]) + tc.END, "ends after an extended header"),
        (tc.pax([("path", "a")]) + tc.pax([("path", "b")]) + tc.header("f") + tc.END, "two pax headers"),
        (tc.gnu_long(b"a") + tc.gnu_long(b"b") + tc.header("f") + tc.END, "two long names"),
        (tc.gnu_long(b"a") + tc.pax([("path", "b")]) + tc.header("f") + tc.END, "both a pax path and a GNU"),
        (tc.pax([("path", "/etc/x")], kind=b"g") + tc.header("f") + tc.END, "a pax global header that sets path"),
        (b"".join(tc.pax([("comment", "c")], kind=b"g") for _ in range(9)) + tc.header("f") + tc.END, "global"),
        (tc.pax([("size", "1_000")]) + tc.header("f") + tc.END, "invalid size"),
        (tc.pax([("GNU.sparse.map", "0,1")]) + tc.header("f") + tc.END, "sparse file"),
        (tc.header(b"././@PaxHeader", b"x", 9) + tc.pad(b"7 a=bzz\n\n") + tc.header("f") + tc.END, "malformed"),
        (tc.header(b"././@PaxHeader", b"x", 6) + tc.pad(b"6 ab\n\n") + tc.header("f") + tc.END, "malformed"),
        (tc.header("f", b"S") + tc.END, "unsupported entry type b'S'"),
        (tc.header("d", b"5", size=10) + tc.pad(b"x" * 10) + tc.END, "a directory with 10 bytes of data"),
        (tc.header("f/", b"0") + tc.END, "a file whose name ends in '/'"),
        (tc.header(b"\xff\xfe.py") + tc.END, "the name is not UTF-8"),
        (tc.pax([("path", "a\x00b")]) + tc.header("f") + tc.END, r"invalid name \(NUL\)"),
        (tc.header("C:evil.py") + tc.END, "absolute path"),
        (tc.header("a\\..\\evil.py") + tc.END, "a backslash"),
        (tc.pax([("path", "x" * 256)]) + tc.header("f") + tc.END, "a component of the path is over 255 bytes"),
        (tc.pax([("path", "x/" * 512 + "y")]) + tc.header("f") + tc.END, "name over 1024 bytes"),
        (tc.header("l", b"2", link="") + tc.END, "link to nothing"),
        (tc.pax([("linkpath", "a/" * 600)]) + tc.header("l", b"2") + tc.END, "link target over 1024 bytes"),
        (tc.pax([("linkpath", "a/" * 200)]) + tc.header("l", b"2") + tc.END, "more than 128 components"),
        (tc.header(".", b"0") + tc.END, "in the place of the archive's own directory"),
        (tc.END, "the archive is empty"),
        (tc.member("./", kind=b"5") + tc.END, "the archive is empty"),
        (tc.member("f", b"1") + tc.member("f", b"2") + tc.END, "'f': a file where the archive already has a file"),
        (tc.member("d/f", b"1") + tc.header("d", b"2", link="x") + tc.END, "a link where the archive already has"),
        (tc.member("f", b"1") + tc.member("f/g", b"1") + tc.END, "'f/g': written through the file 'f'"),
    ],
)
def test_malformed_and_ambiguous_archives_are_refused(tmp_path: Path, raw: bytes, why: str) -> None:
    with pytest.raises(ArchiveError, match=why):
        check(write(tmp_path, tc.gz(raw)), SMALL)


def test_a_directory_may_come_twice_and_after_what_it_holds(tmp_path: Path) -> None:
    raw = tc.member("d/f", b"1") + tc.member("d", kind=b"5") + tc.member("d/", kind=b"5") + tc.END
    assert check(write(tmp_path, tc.gz(raw)), SMALL).entries == 2


# ------------------------------------------------------------------------------------------- links resolved


@pytest.mark.parametrize(
    "links",
    [
        [("l", "d/../d/f")],  # down and up inside
        [("d/u", ".."), ("x", "d/u/d/f")],  # through a link that goes up, still inside
        [("d/u", ".."), ("x", "d/u/d/u/d/u/d")],  # round a loop of directories, not of links
        [("x", "y/z"), ("y", "d")],  # order does not matter: y is resolved when x is
        [("x", "nothing/here/..")],  # dangling: followed lexically
        [("x", "f/..")],  # through a file: followed lexically (the kernel would say ENOTDIR)
        [(f"c{i}", f"c{i + 1}") for i in range(39)] + [("c39", "d")],  # 40 links inside one another
    ],
)
def test_links_that_stay_inside_are_accepted(tmp_path: Path, links: list[tuple[str, str]]) -> None:
    blob = tc.tar_gz(entry("d", D), entry("d/f"), entry("f"), *(entry(n, S, t) for n, t in links))
    dest = tmp_path / "dest"
    summary = extract(write(tmp_path, blob), hashlib.sha256(blob).hexdigest(), dest, SMALL)
    assert summary.entries == 3 + len(links)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.gz", "dest"]


@pytest.mark.parametrize(
    ("links", "why"),
    [
        ([("x", "..")], "'x': link leaves the archive \\('..'\\)"),
        ([("d/x", "../..")], "'d/x': link leaves the archive"),
        ([("d/u", ".."), ("x", "d/u/..")], "'x': link leaves the archive through the link 'd/u'"),
        ([("u", "d/.."), ("v", "u/d/../u/..")], "'v': link leaves the archive through the link 'u'"),
        ([("x", "y/../../z"), ("y", "d/f/../../d")], "'x': link leaves the archive"),
        ([("a", "b"), ("b", "c"), ("c", "a")], "link loop"),
        ([(f"c{i}", f"c{i + 1}") for i in range(41)] + [("c41", "d")], "more than 40 links inside one another"),
        ([("x", "/")], "link to an absolute path"),
    ],
)
def test_links_that_leave_through_links_are_refused(tmp_path: Path, links: list[tuple[str, str]], why: str) -> None:
    blob = tc.tar_gz(entry("d", D), entry("d/f"), entry("f"), *(entry(n, S, t) for n, t in links))
    with pytest.raises(ArchiveError, match=why):
        check(write(tmp_path, blob), SMALL)


def test_hard_links_are_refused_whatever_they_name(tmp_path: Path) -> None:
    for target in ("f", "l", "/etc/passwd", "../x"):
        blob = tc.tar_gz(entry("f"), entry("l", S, "f"), entry("h", H, target))
        with pytest.raises(ArchiveError, match="'h': hard link"):
            check(write(tmp_path, blob), SMALL)


# ------------------------------------------------------------------------------------------------- limits


def test_entries_count_the_directories_their_paths_imply(tmp_path: Path) -> None:
    limits = ArchiveLimits(max_unpacked_bytes=1 << 20, max_entries=10)
    deep = tc.gz(tc.member("/".join("abcdefghij") + "/f", b"1") + tc.END)  # 1 member, 11 entries
    with pytest.raises(ArchiveError, match="more than 10 entries"):
        check(write(tmp_path, deep), limits)
    assert check(write(tmp_path, tc.gz(tc.member("/".join("abcdefghi") + "/f", b"1") + tc.END)), limits).entries == 10


def test_sizes_are_counted_before_the_data_is_read(tmp_path: Path) -> None:
    limits = ArchiveLimits(max_unpacked_bytes=1000, max_entries=10)
    ok = tc.gz(tc.member("a", b"x" * 600) + tc.member("b", b"x" * 400) + tc.END)
    assert check(write(tmp_path, ok), limits).unpacked_bytes == 1000
    over = tc.member("a", b"x" * 600) + tc.header("b", size=401)  # no data after the header: never read
    with pytest.raises(ArchiveError, match=r"'b': more than 1000 bytes unpacked \(1001 with this file of 401\)"):
        check(write(tmp_path, tc.gz(over)), limits)


def test_a_bomb_is_cut_where_the_reader_stops_asking(tmp_path: Path) -> None:
    """A 1 MiB file then 64 GiB of zeros (64 MiB of gzip): the reader inflates the file, finds the end-of-archive
    block in the zeros and stops; the next _OUT_STEP is the most it ever inflated ahead."""
    blob = tc.bomb(tc.member("f", b"x" * (1 << 20)), 64 << 30)
    inflated = 0
    real = zlib.decompressobj

    class Counting:
        def __init__(self, wbits: int) -> None:
            self.z = real(wbits)

        def decompress(self, data: bytes, max_length: int) -> bytes:
            nonlocal inflated
            out = self.z.decompress(data, max_length)
            inflated += len(out)
            assert max_length == OUT_STEP
            return out

        def __getattr__(self, name: str) -> object:
            return getattr(self.z, name)

    mp = pytest.MonkeyPatch()
    mp.setattr(zlib, "decompressobj", Counting)
    try:
        assert check(write(tmp_path, blob), SMALL).unpacked_bytes == 1 << 20
    finally:
        mp.undo()
    assert inflated <= (1 << 20) + 2 * OUT_STEP


def test_pax_records_are_bounded_per_header_and_in_all(tmp_path: Path) -> None:
    assert check(write(tmp_path, tc.gz(tc.pax([("k", "v")] * 64) + tc.header("f") + tc.END)), SMALL).entries == 1
    limits = ArchiveLimits(max_unpacked_bytes=1 << 20, max_entries=4)
    raw = b"".join(tc.pax([(f"k{j}", "v") for j in range(20)]) + tc.header(f"f{i}") for i in range(4))
    with pytest.raises(ArchiveError, match="more than 64 pax records in all"):
        check(write(tmp_path, tc.gz(raw + tc.END)), limits)


def test_link_targets_are_bounded_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive_tree, "MAX_LINK_BYTES_TOTAL", 1000)
    blob = tc.tar_gz(entry("d", D), *(entry(f"l{i}", S, "d/" + "x" * 250) for i in range(4)))
    with pytest.raises(ArchiveError, match="'l3': link targets of more than 1000 bytes in all"):
        check(write(tmp_path, blob), SMALL)


# ----------------------------------------------------------------------------------------- the worker's side


def test_extract_wants_the_digest_and_an_empty_destination(tmp_path: Path) -> None:
    blob = tc.tar_gz(entry("m.py"))
    archive = write(tmp_path, blob)
    digest = hashlib.sha256(blob).hexdigest()
    with pytest.raises(ArchiveError, match="does not match its digest"):
        extract(archive, "0" * 64, tmp_path / "bad", SMALL)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ArchiveError, match="is not empty"):
        extract(archive, digest, tmp_path / "full", SMALL)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(OSError):  # the destination itself is opened with O_NOFOLLOW
        extract(archive, digest, tmp_path / "link", SMALL)
    assert not any((tmp_path / "elsewhere").iterdir())


def test_the_writer_never_follows_a_link_it_did_not_make(tmp_path: Path) -> None:
    """Defence under the checks: were a link in the destination (planted by another process of the team's user
    while it unpacks), a write through it fails with ELOOP/ENOTDIR instead of landing outside."""
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "pkg").symlink_to(outside)
    (dest / "f").symlink_to(outside / "f")
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    writer = Writer(root)
    reader = TarReader(Inflater(io.BytesIO(tc.gz(b""))), SMALL)
    try:
        with pytest.raises(ArchiveError, match="a link or a file is where a directory should be"):
            writer.directory(("pkg", "sub"), "pkg/sub/x.py")
        with pytest.raises(ArchiveError, match="already exists"):
            writer.file(Member("f", FILE, ("f",), 0, 0o644, ""), reader)
        with pytest.raises(ArchiveError, match="already exists"):
            writer.symlink(("pkg",), "elsewhere", "pkg")
    finally:
        writer.close()
        os.close(root)
    assert not any(outside.iterdir())


def test_links_are_made_after_everything_else(tmp_path: Path) -> None:
    """A link comes first in the archive, files under a directory of the same name never can (refused); the
    link itself appears only once the whole archive passed and its digest was found again."""
    blob = tc.tar_gz(entry("a", S, "pkg/m.py"), entry("pkg/m.py"), entry("z", S, "pkg"))
    seen: list[str] = []
    real = Writer.symlink

    def record(self: Writer, parts: tuple[str, ...], target: str, name: str) -> None:
        seen.append(f"{name} after {sorted(everything_under(tmp_path / 'dest'))}")
        real(self, parts, target, name)

    mp = pytest.MonkeyPatch()
    mp.setattr(Writer, "symlink", record)
    try:
        extract(write(tmp_path, blob), hashlib.sha256(blob).hexdigest(), tmp_path / "dest", SMALL)
    finally:
        mp.undo()
    assert seen == ["a after ['pkg', 'pkg/m.py']", "z after ['a', 'pkg', 'pkg/m.py']"]


def test_the_command_line_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob, packed = pack_bytes(ROOT / "examples" / "digits")
    archive = write(tmp_path, blob)
    digest = hashlib.sha256(blob).hexdigest()
    args = [
        "extract",
        "--archive",
        str(archive),
        "--digest",
        digest,
        "--max-unpacked-bytes",
        "1000000",
        "--max-entries",
        "100",
    ]
    assert ca.main([*args, "--dest", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == {"entries": packed.entries, "unpacked_bytes": packed.unpacked_bytes}
    assert (tmp_path / "out" / "digits.py").read_bytes() == (ROOT / "examples" / "digits" / "digits.py").read_bytes()

    hostile = tc.tar_gz(entry("ok.py"), entry("sub", D), entry("sub/up", S, ".."), entry("x", S, "sub/up/.."))
    bad = write(tmp_path, hostile, "bad.tar.gz")
    bad_args = [
        "extract",
        "--archive",
        str(bad),
        "--digest",
        hashlib.sha256(hostile).hexdigest(),
        "--dest",
        str(tmp_path / "bad"),
        "--max-unpacked-bytes",
        "1000000",
        "--max-entries",
        "100",
    ]
    assert ca.main(bad_args) == 65
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.fullmatch(r"archive refused: 'x': link leaves the archive through the link 'sub/up' .*\n", captured.err)

    assert ca.main([*args, "--dest", str(tmp_path / "out")]) == 65  # not empty: an archive error too
    assert "is not empty" in capsys.readouterr().err
    assert ca.main([*args[:4], "0" * 63, *args[5:], "--dest", str(tmp_path / "o2")]) == 1  # not a SHA-256
    assert ca.main([*args, "--dest", str(tmp_path / "o3"), "--max-entries", "0"]) == 1
    missing = ["extract", "--archive", str(tmp_path / "none"), *args[3:], "--dest", str(tmp_path / "o4")]
    assert ca.main(missing) == 1
    assert "FileNotFoundError" in capsys.readouterr().err


def test_the_extract_path_needs_no_tarfile() -> None:
    """The worker's side imports only what ``python -m core.code_archive`` loads: the standard library, no
    tarfile (``pack`` imports it for trusted data only)."""
    source = Path(ca.__file__).read_text()
    top = source[: source.index("# ---")]
    assert "import tarfile" not in top and "import gzip" not in top
    assert not re.search(r"^(?:import|from) (?!__future__)(?:api|core|cli|workers|trainer)\b", source, re.M)


class Pipe(io.BytesIO):
    def seekable(self) -> bool:
        return False


@pytest.mark.parametrize("source", [io.BytesIO, Pipe])
def test_the_command_reads_the_archive_from_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: type[io.BytesIO]
) -> None:
    """``--archive -``: the worker opens the archive and hands it over as standard input (the sandbox gets no path
    into the store). A pipe is hashed as it is unpacked: a wrong digest is found at the end, before any link."""
    blob = tc.tar_gz(entry("m.py", data=b"x = 1\n"), entry("l", S, "m.py"))
    digest = hashlib.sha256(blob).hexdigest()
    limits = ["--max-unpacked-bytes", "1000", "--max-entries", "10"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(source(blob)))
    assert ca.main(["extract", "--archive", "-", "--digest", digest, "--dest", str(tmp_path / "a"), *limits]) == 0
    assert json.loads(capsys.readouterr().out) == {"entries": 2, "unpacked_bytes": 6}
    assert (tmp_path / "a" / "l").read_text() == "x = 1\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(source(blob)))
    assert ca.main(["extract", "--archive", "-", "--digest", "1" * 64, "--dest", str(tmp_path / "b"), *limits]) == 65
    assert "does not match its digest" in capsys.readouterr().err
    assert not (tmp_path / "b" / "l").exists()
    assert (tmp_path / "b" / "m.py").exists() == (source is Pipe)  # seekable: nothing written at all
