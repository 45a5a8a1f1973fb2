"""Issue 38: hostile code archives, against the API as its clients reach it and against the worker's unpacking.

Before: the API checked an upload with tarfile and a lexical look at links, and the worker unpacked as root with
tarfile's ``data`` filter, which this interpreter's tarfile (3.11.7) lets the CVE-2025-4517 shape through: the
archive below wrote ``newfile`` next to the destination. A 0.5 MB pax header of digits held the API for seconds
(tarfile's regular expressions, CVE-2024-6232), and a GNU long name claiming 1 GiB had tarfile read it all into
memory.

Now every archive of ``tarcraft.hostile`` (at the API's default limits: up to 64 MiB of gzip, 512 MiB unpacked,
20,000 entries) is refused by the real API process (uvicorn) with problem+json within seconds (1.46 s at most on an
idle box), its memory (RSS, the peak while the request runs) growing by 50 MB at most, and nothing is stored. The
worker's side runs as the sandbox runs it: ``python -m core.code_archive extract`` in a process of its own, which
refuses them too (exit 65) and unpacks what is accepted inside its destination only; the CLI's packing of the
examples is still accepted."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from core.code_archive import pack_bytes
from harness import tarcraft as tc
from harness.tarcraft import D, S, entry
from tests.security.live import Live

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SITE_PACKAGES = f"{sys.prefix}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
HOSTILE = tc.hostile(SITE_PACKAGES, full=True)
# The API answered each within 1.46 s on an idle 2-core box (test_zz_figures prints each case's seconds and MB with
# `pytest -s`; bench/archive_check_bench.py times the check alone: 1.28 s, 16 MB at most); a test
# on a CI box loaded by the other half of the suite holds the order of magnitude (the old check: 7-20 s), not the
# figure, which is the bench's to measure.
MAX_SECONDS = 6.0
MAX_GROWTH = 50_000_000
UPLOAD_LIMIT = 64 << 20  # the API's default (KILN_ARTIFACT_MAX_UPLOAD_BYTES)
LIMIT_ARGS = ["--max-unpacked-bytes", str(512 << 20), "--max-entries", "20000"]  # the defaults


@dataclass
class Watched:
    seconds: float = 0.0
    growth: int = 0  # bytes: the peak RSS while it ran, less the RSS before


@contextmanager
def watching(pid: int) -> Iterator[Watched]:
    """Wall time, and the growth of ``pid``'s resident memory, sampled every 2 ms, while the block runs."""
    proc = psutil.Process(pid)
    before = peak = proc.memory_info().rss
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, proc.memory_info().rss)
            stop.wait(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    watched = Watched()
    started = time.perf_counter()
    try:
        yield watched
    finally:
        watched.seconds = time.perf_counter() - started
        stop.set()
        sampler.join()
        watched.growth = max(peak, proc.memory_info().rss) - before


def upload(live: Live, blob: bytes) -> httpx.Response:
    digest = hashlib.sha256(blob).hexdigest()
    headers = {**live.headers(), "Content-Type": "application/gzip"}
    return httpx.put(f"{live.kiln.url}/v1/teams/default/artifacts/{digest}", content=blob, headers=headers, timeout=60)


def stored(live: Live) -> set[str]:
    return {p.name for p in (live.kiln.home / "storage" / "artifacts").rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def api(live: Live) -> Live:
    """The live API, warmed by uploading the examples as ``kiln submit --workdir`` packs them: still accepted."""
    for example in ("digits", "digits-script"):
        blob, summary = pack_bytes(ROOT / "examples" / example)
        r = upload(live, blob)
        assert r.status_code in (200, 201), r.text
        assert (r.json()["entries"], r.json()["unpacked_bytes"]) == (summary.entries, summary.unpacked_bytes)
    return live


FIGURES: dict[str, tuple[float, float]] = {}  # case -> (seconds, MB): printed at the end (pytest -s)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_api_refuses_each_hostile_archive_quickly_and_in_little_memory(api: Live, case: str) -> None:
    build, why = HOSTILE[case]
    blob = build()
    assert len(blob) <= UPLOAD_LIMIT
    before = stored(api)
    with watching(api.kiln.procs["api"].pid) as watched:
        r = upload(api, blob)
    FIGURES[case] = (watched.seconds, watched.growth / 1e6)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["errors"][0]["loc"] == "archive"
    assert re.search(why, problem["detail"]), problem["detail"]
    assert watched.seconds <= MAX_SECONDS, f"{case}: {watched.seconds:.2f} s"
    assert watched.growth <= MAX_GROWTH, f"{case}: the API grew by {watched.growth / 1e6:.1f} MB"
    assert stored(api) == before  # nothing kept, not even the upload's temporary file
    assert not Path(f"{SITE_PACKAGES}/kiln-pwned.pth").exists()


def test_over_the_upload_limit_is_413_before_the_archive_is_read(api: Live) -> None:
    blob = tc.bomb(tc.header("big", size=1 << 20), 65_000 << 20)
    assert len(blob) > UPLOAD_LIMIT
    with watching(api.kiln.procs["api"].pid) as watched:
        try:
            r = upload(api, blob)
        except httpx.TransportError:  # the API may answer and close before the body is all sent
            pytest.skip("the client could not read the 413 it was sent before its body was written")
    FIGURES["over the upload limit (413)"] = (watched.seconds, watched.growth / 1e6)
    assert r.status_code == 413 and r.headers["content-type"] == "application/problem+json"
    assert "limit" in r.json()["detail"]
    assert watched.seconds <= MAX_SECONDS and watched.growth <= MAX_GROWTH


def test_zz_figures(api: Live) -> None:
    """The measured figures, worst last (shown with ``pytest -s``)."""
    for case, (seconds, mb) in sorted(FIGURES.items(), key=lambda kv: kv[1]):
        print(f"{case:45s} {seconds:6.3f} s  {mb:6.1f} MB")


# ------------------------------------------------------------------------------------- the worker's unpacking


def extract_process(
    archive: Path, dest: Path, digest: str | None = None, via: str = "path"
) -> subprocess.CompletedProcess[str]:
    """``python -m core.code_archive extract`` in a process of its own, the archive named (``via`` "path"), or on
    its standard input as the worker hands it to its sandbox ("stdin": the open file; "pipe": a pipe)."""
    digest = digest or hashlib.sha256(archive.read_bytes()).hexdigest()
    cmd = [
        sys.executable,
        "-m",
        "core.code_archive",
        "extract",
        "--archive",
        str(archive) if via == "path" else "-",
        "--digest",
        digest,
        "--dest",
        str(dest),
        *LIMIT_ARGS,
    ]
    if via == "pipe":
        done = subprocess.run(cmd, input=archive.read_bytes(), capture_output=True, timeout=120, cwd=ROOT)
    else:
        with archive.open("rb") as stdin:
            given = stdin if via == "stdin" else subprocess.DEVNULL
            done = subprocess.run(cmd, stdin=given, capture_output=True, timeout=120, cwd=ROOT)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def tree_of(root: Path) -> dict[str, str]:
    """Every path under ``root`` with what it is (a link: its target; a file: its SHA-256), links not followed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {os.readlink(p)}"
        else:
            out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """What the sandbox sees, and something of another team's beside it that must stay untouched."""
    (tmp_path / "box").mkdir()
    other = tmp_path / "other-team" / "checkpoints"
    other.mkdir(parents=True)
    (other / "step-100.pt").write_text("weights")
    return tmp_path / "box"


@pytest.mark.parametrize("via", ["path", "stdin"])
@pytest.mark.parametrize(
    "case",
    [
        "cve-2025-4517 through links",
        "cve-2025-4517 with a hard link",
        "link leaves through a link",
        "link leaves through a later link",
        "chain of links leaves",
        "file written through a link to a directory",
        "file written through a link that leaves",
        "pth into site-packages (relative)",
        "pth into site-packages (absolute)",
        "pth through a link to site-packages",
        "hard link to an escaping link",
        "fifo",
        "character device",
    ],
)
def test_the_unpacking_process_refuses_them_and_writes_nothing_outside(box: Path, case: str, via: str) -> None:
    build, why = HOSTILE[case]
    if case.startswith("cve"):  # sized for this destination: the resolved path outgrows PATH_MAX
        blob = tc.cve_2025_4517((4096 - len(str(box / "dest")) - 1) // 17, hard_link="hard" in case)
    else:
        blob = build()
    archive = box / "code.tar.gz"
    archive.write_bytes(blob)
    outside = tree_of(box.parent)
    done = extract_process(archive, box / "dest", via=via)
    assert done.returncode == 65, done.stderr
    assert done.stdout == ""
    assert re.fullmatch(f"archive refused: .*{why}.*\n", done.stderr, re.S), done.stderr
    after = tree_of(box.parent)
    assert {k: v for k, v in after.items() if not k.startswith("box/dest")} == outside
    assert not any(v.startswith("->") for k, v in after.items() if k.startswith("box/dest"))
    assert not Path(f"{SITE_PACKAGES}/kiln-pwned.pth").exists()


TRICKY = {
    "links inside, through an up-link": (
        [
            entry("pkg", D),
            entry("pkg/m.py", data=b"m"),
            entry("pkg/up", S, ".."),
            entry("alias", S, "pkg/up/pkg"),
            entry("again", S, "alias/up/alias/m.py"),
        ],
        {"alias/m.py": "m", "again": "m", "pkg/up/pkg/m.py": "m"},
    ),
    "a link to a directory, then its files (by the directory's name)": (
        [entry("data", S, "real"), entry("real/x.csv", data=b"1,2"), entry("real/sub/y.csv", data=b"3")],
        {"data/x.csv": "1,2", "data/sub/y.csv": "3"},
    ),
    "dangling links and a link to a link": (
        [entry("later", S, "build/out"), entry("l1", S, "l2"), entry("l2", S, "f"), entry("f", data=b"f")],
        {"l1": "f"},
    ),
}


@pytest.mark.parametrize("case", sorted(TRICKY))
def test_tricky_archives_unpack_inside_their_destination_only(box: Path, case: str) -> None:
    members, reads = TRICKY[case]
    blob = tc.tar_gz(*members)
    archive = box / "code.tar.gz"
    archive.write_bytes(blob)
    outside = tree_of(box.parent)
    done = extract_process(archive, box / "dest")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["entries"] >= len(members)
    dest = box / "dest"
    for path, text in reads.items():
        assert (dest / path).read_text() == text
    for link in (p for p in dest.rglob("*") if p.is_symlink()):  # every link resolves inside (or nowhere yet)
        assert os.path.realpath(link).startswith(str(dest.resolve()))
    assert {k: v for k, v in tree_of(box.parent).items() if not k.startswith("box/dest")} == outside


def test_a_file_under_a_links_name_is_refused_by_the_process(box: Path) -> None:
    blob = tc.tar_gz(entry("real", D), entry("data", S, "real"), entry("data/x.csv", data=b"1,2"))
    archive = box / "code.tar.gz"
    archive.write_bytes(blob)
    done = extract_process(archive, box / "dest")
    assert done.returncode == 65
    assert "'data/x.csv': written through the link 'data'" in done.stderr
    assert sorted(p.name for p in (box / "dest").iterdir()) == ["real"]


@pytest.mark.parametrize("via", ["path", "stdin", "pipe"])
def test_the_examples_unpack_by_the_process_as_they_were_packed(box: Path, via: str) -> None:
    for example in ("digits", "digits-script"):
        blob, summary = pack_bytes(ROOT / "examples" / example)
        archive = box / f"{example}.tar.gz"
        archive.write_bytes(blob)
        done = extract_process(archive, box / example, via=via)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"entries": summary.entries, "unpacked_bytes": summary.unpacked_bytes}
        for src in (ROOT / "examples" / example).iterdir():
            assert (box / example / src.name).read_bytes() == src.read_bytes()
    bad = extract_process(box / "digits.tar.gz", box / "again", digest="0" * 64)
    assert bad.returncode == 65 and "does not match its digest" in bad.stderr
