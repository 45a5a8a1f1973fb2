"""A hostile team's script (script mode), uploaded with ``hostile.py``: ``python train.py all TARGETS`` runs every
attack of ``attacks.py`` (and fails with the OS's refusal when all are denied); ``python train.py commit`` leaves a
daemon behind, then reports its steps and commits a checkpoint through kiln's client, as its team's own uid."""

from __future__ import annotations

import json
import os
import sys

import attacks


def commit() -> None:
    from trainer import script_client as kiln

    attacks.leave_a_process({})
    print(f"uid {os.getuid()} gid {os.getgid()}", flush=True)
    for step in range(1, kiln.steps() + 1):
        kiln.report(step, 1.0 / step)
    with kiln.checkpoint(kiln.steps(), loss=1.0 / kiln.steps()) as d:
        (d / "state.txt").write_text("mine")


if __name__ == "__main__":
    if sys.argv[1] == "all":
        attacks.run_all(json.loads(sys.argv[2]))
    else:
        commit()
