"""The liveness file a container healthcheck reads (core/liveness.py); ``python -m core.liveness`` itself, a process:
tests/e2e/test_liveness_command.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from core.liveness import MIN_STALE_S, Pulse, check, stale_after_s

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_beat_is_healthy_and_says_its_state(tmp_path: Path) -> None:
    Pulse(tmp_path / "alive.json", 2.0).beat("leading")
    healthy, why = check(tmp_path / "alive.json")
    assert healthy and why.startswith("leading: last beat 0.")
    record = json.loads((tmp_path / "alive.json").read_text())
    assert record["pid"] == os.getpid() and record["interval_s"] == 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["alive.json"]  # no temporary file left behind


def test_stale_after_three_missed_beats_and_never_under_the_floor(tmp_path: Path) -> None:
    assert stale_after_s(2.0) == MIN_STALE_S
    assert stale_after_s(10.0) == 30.0
    Pulse(tmp_path / "a", 10.0).beat("heartbeat")
    at = json.loads((tmp_path / "a").read_text())["at"]
    assert check(tmp_path / "a", now=at + 29.0)[0]
    healthy, why = check(tmp_path / "a", now=at + 31.0)
    assert not healthy and why == "heartbeat: last beat 31.0 s ago, stale after 30 s"
    assert not check(tmp_path / "a", now=at + 3.0, max_age_s=2.0)[0]


def test_missing_or_garbled_files_are_unhealthy(tmp_path: Path) -> None:
    assert check(tmp_path / "none") == (False, f"{tmp_path / 'none'}: no beat yet")
    (tmp_path / "bad").write_text('{"at": "soon"')
    healthy, why = check(tmp_path / "bad")
    assert not healthy and "unreadable" in why


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    Pulse(None, 1.0).beat("standby")
    assert list(tmp_path.iterdir()) == []
