"""The API's check of an uploaded archive (``core.code_archive.check``) on hostile archives, each in a process of
its own: wall time, CPU time and how much the process's peak RSS grew, beside the check it replaced (tarfile,
``git show REV:core/code_archive.py``) measured in the same run on the same files, each under a time limit.

The archives are built here (harness/tarcraft.py), at the API's default limits (64 MiB upload, 512 MiB
unpacked, 20,000 entries): decompression bombs (zeros only; a header claiming 64 GiB; honest headers whose sizes
pass the limit after 500 MiB; 500 MiB of literal-coded data, inflate's slowest, then a bad entry), oversized
headers (a 4 MiB pax header, a 1 MiB GNU long name), the most Python work an archive can ask for under the limits
(20,000 entries at depth 64 that defeat the parent cache, link targets up to the 2 MiB total, pax records up to the
total), the CVE-2025-4517 shape, and examples/digits packed by the CLI (accepted) as a reference.

    .venv/bin/python bench/archive_check_bench.py [--smoke] [--old-rev HEAD~1] [--old-timeout 60]

JSON: bench/results/archive_check_bench.json (not with --smoke: small sizes, the harness checked in seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.code_archive import pack_bytes  # noqa: E402
from harness import tarcraft as tc  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MAX_ENTRIES = 20_000
MAX_UNPACKED = 512 << 20

# One check in a fresh interpreter: RSS after the imports, the peak reset (clear_refs), the check, then the peak
# (VmHWM; ru_maxrss would carry the bench's own peak across fork and exec).
PROBE = r"""
import importlib.util, json, sys, time
from pathlib import Path
path = Path(sys.argv[1])  # the old revision's single module, or the package (its own relative imports)
search = [str(path.parent)] if path.name == "__init__.py" else None
spec = importlib.util.spec_from_file_location("probe_archive", path, submodule_search_locations=search)
mod = importlib.util.module_from_spec(spec)
sys.modules["probe_archive"] = mod
spec.loader.exec_module(mod)
def status(key):
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith(key + ":")) * 1024
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")
limits = mod.ArchiveLimits(max_unpacked_bytes=int(sys.argv[3]), max_entries=int(sys.argv[4]))
t, c = time.perf_counter(), time.process_time()
try:
    summary = mod.check(Path(sys.argv[2]), limits)
    verdict = f"accepted: {summary.entries} entries, {summary.unpacked_bytes} bytes"
except Exception as exc:
    verdict = f"{type(exc).__name__}: {exc}"
wall, cpu = time.perf_counter() - t, time.process_time() - c
peak = status("VmHWM")
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rss_growth_mb": (peak - before) / 1e6, "verdict": verdict[:300]}))
"""


def pax_records(entries: int, records: int) -> bytes:
    """``entries`` files, each with a pax header of ``records`` small records."""
    head = tc.pax([(f"k{i}", "v") for i in range(records)])
    return tc.gz(b"".join(head + tc.header(f"f{i}") for i in range(entries)) + tc.END)


def cases(smoke: bool) -> dict[str, Callable[[], bytes]]:
    scale = 16 if smoke else 1
    big = 64_000 << 20 if not smoke else 1 << 30  # 62.5 GiB of zeros in 63.3 MiB of gzip
    digits, _ = pack_bytes(ROOT / "examples" / "digits")
    return {
        "digits (CLI pack, accepted)": lambda: digits,
        "gzip of zeros only (63 MiB -> 62.5 GiB)": lambda: tc.bomb(b"", big),
        "header claims 64 GiB (63 MiB gzip)": lambda: tc.bomb(tc.header("big", size=64 << 30), big),
        "honest headers, 6 x 100 MiB of zeros": lambda: tc.honest_zeros(6, 100 // scale),
        "500 MiB literal-coded, then an absolute path": lambda: tc.literal_coded(
            (500 << 20) // scale, tc.member("/etc/cron.d/x", b"x")
        ),
        "pax header of 4 MiB": lambda: tc.gz(tc.pax([("path", "x" * (4 << 20))]) + tc.member("f", b"x") + tc.END),
        "GNU long name of 1 MiB": lambda: tc.gz(tc.gnu_long(b"a" * (1 << 20)) + tc.member("f", b"x") + tc.END),
        "pax header of 128 KiB of digits (tarfile's ReDoS)": lambda: tc.gz(
            tc.header(b"././@PaxHeader", b"x", (128 << 10) // scale) + b"1" * ((128 << 10) // scale) + tc.END
        ),
        "GNU long name claiming 256 MiB (0.26 MiB gzip)": lambda: tc.bomb(
            tc.header(b"././@LongLink", b"L", (256 << 20) // scale), (256 << 20) // scale
        ),
        "20,001 entries at depth 64, parent cache defeated": lambda: tc.deep_alternating(MAX_ENTRIES // scale + 1),
        "20,000 directories at depth 64": lambda: tc.deep_directories(MAX_ENTRIES // scale),
        "links: 2 MiB of targets, chains of 39": lambda: tc.many_links((2 << 20) // scale),
        "pax records: 20,000 entries x 16": lambda: pax_records(MAX_ENTRIES // scale, 16),
        "CVE-2025-4517 shape": lambda: tc.cve_2025_4517(236),
    }


def probe(module: Path, archive: Path, limits: tuple[int, int], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-c", PROBE, str(module), str(archive), str(limits[0]), str(limits[1])]
    started = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=True).stdout
    except subprocess.TimeoutExpired:
        return {"wall_s": round(time.perf_counter() - started, 1), "verdict": f"still running after {timeout:.0f} s"}
    result: dict[str, Any] = json.loads(out)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small archives: checks the harness in seconds")
    parser.add_argument("--old-rev", default="02a94ba", help="the revision whose tarfile-based check is the baseline")
    parser.add_argument("--old-timeout", type=float, default=60.0)
    args = parser.parse_args()
    limits = (MAX_UNPACKED // (16 if args.smoke else 1), MAX_ENTRIES // (16 if args.smoke else 1))
    work = Path(tempfile.mkdtemp(prefix="archive-bench-"))
    old = work / "old_code_archive.py"
    old.write_bytes(
        subprocess.run(
            ["git", "show", f"{args.old_rev}:core/code_archive.py"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    )
    new = ROOT / "core" / "code_archive" / "__init__.py"
    rows = []
    for label, build in cases(args.smoke).items():
        archive = work / "archive.tar.gz"
        archive.write_bytes(build())
        row: dict[str, Any] = {"archive": label, "gzip_bytes": archive.stat().st_size}
        row["new"] = probe(new, archive, limits, timeout=120)
        row["old"] = probe(old, archive, limits, timeout=args.old_timeout)
        rows.append(row)
        print(
            f"{label:50s} {row['gzip_bytes'] >> 10:>7} KiB  new {row['new']['wall_s']:>6} s "
            f"{row['new'].get('rss_growth_mb', 0):>6} MB  old {row['old']['wall_s']:>6} s "
            f"{row['old'].get('rss_growth_mb', '-'):>6} MB  | {row['new']['verdict'][:70]}",
            flush=True,
        )
        archive.unlink()
    shutil.rmtree(work)
    worst = max(rows, key=lambda r: r["new"]["wall_s"])
    summary = {
        "worst_new_wall_s": worst["new"]["wall_s"],
        "worst_new_archive": worst["archive"],
        "worst_new_rss_growth_mb": max(r["new"]["rss_growth_mb"] for r in rows),
        "worst_old_wall_s": max(r["old"]["wall_s"] for r in rows),
    }
    print(json.dumps(summary))
    if args.smoke:
        return
    out = RESULTS / "archive_check_bench.json"
    out.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "limits": {"max_unpacked_bytes": limits[0], "max_entries": limits[1]},
                "old_rev": args.old_rev,
                "old_timeout_s": args.old_timeout,
                "summary": summary,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
