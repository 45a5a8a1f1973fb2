"""Another team's script (script mode): what of the teams' compile caches can it see from its sandbox? It prints
one ``PROBE`` line, then reports its steps and commits a checkpoint through kiln's client, so the job succeeds."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def probe(victim: Path) -> dict[str, object]:
    own = Path(os.environ["KILN_TEAM_COMPILE_CACHE_DIR"])
    seen: dict[str, object] = {"own": str(own), "own_writable": os.access(own, os.W_OK)}
    seen["victim_visible"] = os.path.exists(victim)
    try:
        seen["teams"] = sorted(os.listdir(victim.parent))
    except OSError as exc:
        seen["teams"] = f"DENIED {exc}"
    try:
        seen["victim_blob"] = len((victim / sys.argv[2] / "artifacts.bin").read_bytes())
    except OSError as exc:
        seen["victim_blob"] = f"DENIED {exc.strerror}"
    try:
        (victim / "planted").mkdir(parents=True)
        seen["victim_write"] = "WROTE"
    except OSError as exc:
        seen["victim_write"] = f"DENIED {exc.strerror}"
    return seen


if __name__ == "__main__":
    from trainer import script_client as kiln

    print("PROBE " + json.dumps(probe(Path(sys.argv[1]))), flush=True)
    for step in range(1, kiln.steps() + 1):
        kiln.report(step, 1.0 / step)
    with kiln.checkpoint(kiln.steps(), loss=1.0 / kiln.steps()) as d:
        (d / "state.txt").write_text("done")
