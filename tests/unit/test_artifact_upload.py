"""The API's side of an upload (``core.services.artifacts.Upload``, issue 38): the body hashed as it arrives and
the archive checked by a thread of its own from the file as it grows, so the verdict is ready about when the last
byte is; a refusal as soon as the bad entry is in; an abandoned upload ends its check and leaves no file; at most
four such checks hold a thread at once (never one of the server's pool), the others checked once received."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from core import code_archive as ca
from core.code_archive import ArchiveLimits
from core.services import artifacts
from harness import tarcraft as tc
from harness.tarcraft import entry

SMALL = ArchiveLimits(max_unpacked_bytes=32 << 20, max_entries=1000)


def test_an_upload_is_hashed_and_checked_while_it_arrives(tmp_path: Path) -> None:
    blob = tc.tar_gz(entry("m.py", data=b"x" * 5000), entry("pkg/n.py"))
    upload = artifacts.Upload(tmp_path, SMALL, max_bytes=1 << 20)
    try:
        assert upload._checker is not None and upload._checker.is_alive()  # waiting for bytes
        for i in range(0, len(blob), 100):
            upload.write(blob[i : i + 100])
        upload.complete()
        checked = upload.finish()
    finally:
        upload.abandon()
    assert checked == artifacts.Checked(hashlib.sha256(blob).hexdigest(), ca.ArchiveSummary(3, 5015))
    assert not upload.path.exists()
    assert not upload._checker.is_alive()


def test_a_hostile_upload_is_refused_as_soon_as_its_entry_arrives(tmp_path: Path) -> None:
    blob = tc.tar_gz(entry("/etc/cron.d/x")) + b"\0" * 4096
    upload = artifacts.Upload(tmp_path, SMALL, max_bytes=1 << 20)
    try:
        upload.write(blob[:-4096])
        assert upload._checker is not None
        upload._checker.join(timeout=10)  # the verdict, before the rest of the body
        assert not upload._checker.is_alive()
        upload.write(blob[-4096:])
        upload.complete()
        checked = upload.finish()
    finally:
        upload.abandon()
    assert checked.summary is None and "absolute path" in checked.error


def test_an_abandoned_upload_ends_its_check_and_leaves_nothing(tmp_path: Path) -> None:
    upload = artifacts.Upload(tmp_path, SMALL, max_bytes=1000)
    upload.write(tc.tar_gz(entry("m.py"))[:20])
    with pytest.raises(artifacts.TooLarge, match="over the limit of 1000 bytes"):
        upload.write(b"x" * 1000)
    upload.abandon()
    assert upload._checker is not None
    upload._checker.join(timeout=10)
    assert not upload._checker.is_alive()
    assert list(tmp_path.rglob("upload-*")) == []


def test_uploads_beyond_the_early_checks_are_checked_once_received(tmp_path: Path) -> None:
    blob = tc.tar_gz(entry("m.py"))
    uploads = [artifacts.Upload(tmp_path, SMALL, max_bytes=1 << 20) for _ in range(6)]
    try:
        assert [u._checker is not None for u in uploads] == [True] * 4 + [False] * 2  # no pool thread waits
        for u in uploads:
            u.write(blob)
            u.complete()
        assert {u.finish().summary for u in uploads} == {ca.ArchiveSummary(1, 15)}
    finally:
        for u in uploads:
            u.abandon()
    taken = [artifacts._EARLY_CHECKS.acquire(blocking=False) for _ in range(4)]  # all four slots are free again
    for _ in range(sum(taken)):
        artifacts._EARLY_CHECKS.release()
    assert taken == [True] * 4
