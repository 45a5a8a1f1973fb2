"""A job's datasets at attempt start: resolved again, made available read-only, passed to the trainer by name.

The spec names the team's registered datasets (``datasets: [digits-npz]``); the claim reads their paths. Before
the attempt starts the worker resolves each one again under the storage root (``core.datasets.resolve``): one
removed since the submit, gone from disk, no longer a directory or now leading out of its area (a link swapped
in) ends the attempt as the user's error, with its name and why - a restart would fail the same way.

How read-only is enforced is chosen once, when the worker starts, and said in its log (``describe``):

* ``mount`` (the worker is root and this host lets it make mount namespaces: probed at start-up): the attempt runs
  in a private mount namespace (``workers.mount_entry``) in which each dataset is bind-mounted read-only, nosuid,
  nodev at ``RUN_DIR/datasets/<name>``; a write fails with EROFS whoever the attempt runs as.
* ``permissions`` (no mount namespace, but attempts run as their team's own user): the attempt is given the
  dataset's own directory; it cannot write there only if the files' owner and modes say so (the operator's).
* ``none`` (a laptop: no root): the attempt is given the directory itself, writable if the worker's user may
  write it.

The trainer gets name -> path in ``KILN_DATASETS`` (JSON), for the recipe (``datasets=``) and for scripts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from core.datasets import DatasetPathError, area_of, check_relative, resolve
from core.trainer_protocol import ENV_DATASETS
from workers.attempt_user import AttemptUser, AttemptUsers

MOUNT_DIR = "datasets"


class DatasetUnavailable(Exception):
    """A dataset of the spec cannot be given to the attempt: the user's (or their team-admin's) to fix."""


@dataclass(frozen=True)
class Resolved:
    name: str
    source: Path  # the real directory
    area: Path  # the resolved area of the storage root it must stay in


def resolve_all(*, names: list[str], registered: dict[str, str], storage: Path, team: str) -> list[Resolved]:
    out = []
    for name in names:
        path = registered.get(name)
        if path is None:
            raise DatasetUnavailable(
                f"dataset {name!r} is no longer registered in team {team!r} (removed after the job was submitted)"
            )
        try:
            source = resolve(storage, path, team)
        except DatasetPathError as exc:
            raise DatasetUnavailable(f"dataset {name!r}: {exc}") from None
        out.append(Resolved(name=name, source=source, area=area_of(storage, check_relative(path, team))))
    return out


class DatasetAccess:
    """How this worker makes datasets read-only for its attempts (see the module's docstring)."""

    def __init__(self, users: AttemptUsers) -> None:
        self.users = users

    @cached_property
    def why_no_mounts(self) -> str | None:
        if os.geteuid() != 0:
            return f"the worker is not root (uid {os.geteuid()}) and cannot make mount namespaces"
        try:
            probe = subprocess.run(
                [sys.executable, "-m", "workers.mount_entry", "--probe"], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the mount probe could not run: {exc}"
        if probe.returncode != 0:
            return f"this host refuses a private mount namespace: {probe.stderr.strip()[:200]}"
        return None

    @property
    def mode(self) -> str:
        if self.why_no_mounts is None:
            return "mount"
        return "permissions" if self.users.enabled else "none"

    def describe(self) -> str:
        mode = self.mode
        if mode == "mount":
            return ("datasets: read-only bind mounts in a private mount namespace per attempt (a write fails with "
                    "EROFS)")  # fmt: skip
        if mode == "permissions":
            return (f"datasets: NOT mounted read-only ({self.why_no_mounts}): attempts read the dataset's own "
                    "directory, read-only only where its files' owner and modes make it so")  # fmt: skip
        return (f"datasets: NOT read-only ({self.why_no_mounts}; attempts run as the worker's own user): an attempt "
                "can write into a dataset the worker's user can write")  # fmt: skip

    def prepare(
        self, datasets: list[Resolved], *, run_dir: Path, argv: list[str], user: AttemptUser | None
    ) -> tuple[list[str], dict[str, str], str]:
        """(the attempt's command, its ``KILN_DATASETS`` environment, a line for its log)."""
        if not datasets:
            return argv, {}, ""
        if self.mode != "mount":
            paths = {d.name: str(d.source) for d in datasets}
            return argv, {ENV_DATASETS: json.dumps(paths, sort_keys=True)}, (
                f"datasets {', '.join(paths)} at their own directories ({self.describe()})"
            )  # fmt: skip
        base = run_dir / MOUNT_DIR
        base.mkdir(exist_ok=True)
        binds: list[str] = []
        paths = {}
        for d in datasets:
            target = base / d.name
            target.mkdir(exist_ok=True)
            binds += ["--bind", str(d.source), str(d.area), str(target)]
            paths[d.name] = str(target)
        if user is not None:
            user.readable(base)  # the mount points are root's: the attempt cannot swap them
        command = [sys.executable, "-m", "workers.mount_entry", *binds, "--", *argv]
        env = {ENV_DATASETS: json.dumps(paths, sort_keys=True)}
        return command, env, f"datasets {', '.join(paths)} mounted read-only at {base}"
