"""The docs' transcripts type the command a reader has after the README's set-up: ``./kiln`` (the wrapper in the
clone's root), not ``kiln``, which is on no PATH then (issue 42, point 6)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_transcripts_type_dot_slash_kiln() -> None:
    bare = [
        f"{doc.relative_to(ROOT)}:{n}: {line}"
        for doc in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if line.startswith("$ kiln ")
    ]
    assert bare == [], "transcripts should type ./kiln:\n" + "\n".join(bare)
