"""The code archive: reproducible packing (the digest names the code), ignore files as git reads them, and the
rules a stored archive must keep (checked by the API, again by the worker before it unpacks)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from core.code_archive import ArchiveError, ArchiveLimits, check, extract, pack_bytes

LIMITS = ArchiveLimits(max_unpacked_bytes=1 << 20, max_entries=100)


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return root


def names(blob: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return tar.getnames()


def test_the_same_files_pack_to_the_same_bytes_whatever_their_times(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", {"m.py": "x = 1\n", "pkg/b.py": "y = 2\n"})
    b = tree(tmp_path / "b", {"pkg/b.py": "y = 2\n", "m.py": "x = 1\n"})
    os.utime(b / "m.py", (1, 1))
    blob_a, summary = pack_bytes(a)
    assert pack_bytes(b)[0] == blob_a
    assert summary.entries == 3 and summary.unpacked_bytes == 12
    (b / "m.py").write_text("x = 2\n")
    assert hashlib.sha256(pack_bytes(b)[0]).digest() != hashlib.sha256(blob_a).digest()


@pytest.mark.parametrize(
    ("ignore", "kept", "dropped"),
    [
        ("*.log\n", ["a.py", "sub/c.py"], ["x.log", "sub/y.log"]),
        ("/data/\n", ["sub/data/k.py"], ["data/big.bin"]),
        ("data/\n!keep.log\n*.log\n", ["a.py"], ["data/big.bin", "keep.log"]),
        ("*.log\n!keep.log\n", ["keep.log"], ["x.log"]),
        ("**/cache\n", ["a.py"], ["sub/cache/z.py"]),
    ],
)
def test_ignore_files_are_honoured(tmp_path: Path, ignore: str, kept: list[str], dropped: list[str]) -> None:
    files = {
        name: "1"
        for name in [
            "a.py",
            "sub/c.py",
            "x.log",
            "sub/y.log",
            "data/big.bin",
            "sub/data/k.py",
            "keep.log",
            "sub/cache/z.py",
        ]
    }
    root = tree(tmp_path, {**files, ".kilnignore": ignore, ".git/HEAD": "ref", "__pycache__/m.pyc": "b"})
    got = names(pack_bytes(root)[0])
    assert all(k in got for k in kept), got
    assert not any(d in got for d in dropped), got
    assert ".git" not in got and "__pycache__" not in got


def test_a_nested_gitignore_applies_below_its_directory(tmp_path: Path) -> None:
    root = tree(tmp_path, {"a.tmp": "1", "sub/.gitignore": "*.tmp\n", "sub/b.tmp": "1", "sub/c.py": "1"})
    got = names(pack_bytes(root)[0])
    assert "a.tmp" in got and "sub/c.py" in got and "sub/b.tmp" not in got


def test_packing_refuses_a_link_out_of_the_directory(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {"a.py": "1"})
    (root / "inside").symlink_to("a.py")
    (root / "escape").symlink_to("../../etc/passwd")
    with pytest.raises(ArchiveError, match="escape.*leaves"):
        pack_bytes(root)
    (root / "escape").unlink()
    assert "inside" in names(pack_bytes(root)[0])


def crafted(tmp_path: Path, *members: tarfile.TarInfo, data: bytes = b"x") -> Path:
    path = tmp_path / "crafted.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (member("../evil.py"), "leaves the archive"),
        (member("a/../../evil.py"), "leaves the archive"),
        (member("/etc/cron.d/evil"), "absolute path"),
        (member("ln", tarfile.SYMTYPE, "../../etc/shadow"), "link leaves"),
        (member("ln", tarfile.SYMTYPE, "/etc/shadow"), "link to an absolute path"),
        (member("hard", tarfile.LNKTYPE, "a.py"), "hard link"),
        (member("dev", tarfile.CHRTYPE), "device"),
        (member("fifo", tarfile.FIFOTYPE), "FIFO"),
    ],
)
def test_bad_entries_are_refused(tmp_path: Path, info: tarfile.TarInfo, why: str) -> None:
    path = crafted(tmp_path, member("a.py"), info)
    with pytest.raises(ArchiveError, match=why):
        check(path, LIMITS)


def test_limits_and_garbage_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="bytes unpacked"):
        check(crafted(tmp_path, member("big"), data=b"0" * (LIMITS.max_unpacked_bytes + 1)), LIMITS)
    with pytest.raises(ArchiveError, match="entries"):
        check(crafted(tmp_path, *(member(f"f{i}") for i in range(LIMITS.max_entries + 1))), LIMITS)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball at all")
    with pytest.raises(ArchiveError, match="not a readable"):
        check(junk, LIMITS)


def test_extract_verifies_the_digest_and_unpacks(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {"m.py": "x = 1\n", "pkg/b.py": "y = 2\n"})
    blob, _ = pack_bytes(root)
    path = tmp_path / "a.tar.gz"
    path.write_bytes(blob)
    digest = hashlib.sha256(blob).hexdigest()
    with pytest.raises(ArchiveError, match="does not match its digest"):
        extract(path, "0" * 64, tmp_path / "bad", LIMITS)
    extract(path, digest, tmp_path / "out", LIMITS)
    assert (tmp_path / "out" / "pkg" / "b.py").read_text() == "y = 2\n"
