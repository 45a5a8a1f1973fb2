"""Regenerate the dashboard's screenshots in docs/img: the browser tests that take them, run with
``KILN_REFRESH_SCREENSHOTS=1`` (harness/dashboard.py), so each image is what a passing test saw.

    .venv/bin/python -m tests.support.screenshots                                  # every one (minutes: jobs train)
    .venv/bin/python -m tests.support.screenshots tests/e2e/test_dashboard_charts.py  # the charts' alone (~30 s)

Arguments are pytest's (files, ``-k``); without files, every test file that writes into docs/img.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.dashboard import DOCS_IMG, REFRESH_SCREENSHOTS

ROOT = Path(__file__).resolve().parents[2]
FILES = [
    "tests/e2e/test_dashboard.py",
    "tests/e2e/test_dashboard_charts.py",
    "tests/e2e/test_dashboard_compile_cache.py",
    "tests/e2e/test_dashboard_estimate.py",
    "tests/e2e/test_dashboard_sweeps.py",
    "tests/e2e/test_webhooks_e2e.py",
]


def main(argv: list[str]) -> int:
    named = any(a.startswith("tests/") for a in argv)
    args = [sys.executable, "-m", "pytest", "-q", *([] if named else FILES), *argv]
    print(f"screenshots into {DOCS_IMG.relative_to(ROOT)}: {' '.join(args[1:])}", flush=True)
    return subprocess.call(args, cwd=ROOT, env={**os.environ, REFRESH_SCREENSHOTS: "1"})


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
