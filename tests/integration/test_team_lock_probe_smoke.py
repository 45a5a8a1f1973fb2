"""``bench/team_lock_probe.py --smoke`` runs (every bench has a smoke that CI runs): each way of taking a team's
place under its cap commits submissions on this machine's PostgreSQL; the figures are an idle box's, not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_team_lock_probe_commits_submissions_each_way(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    done = subprocess.run(
        [sys.executable, "bench/team_lock_probe.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["smoke"] and got["threads"] == 4
    assert set(got["submissions_per_s"]) == {
        "insert_alone",
        "lock_through_sync_commit",
        "lock_to_async_commit_then_durable",
    }
    assert all(rate > 0 for rate in got["submissions_per_s"].values()), got
