"""A job's datasets at attempt start: resolved again, made available read-only, passed to the trainer by name.

The spec names the team's registered datasets (``datasets: [digits-npz]``); the claim reads their paths. Before
the attempt starts the worker resolves each one again under the storage root (``core.datasets.resolve``): one
removed since the submit, gone from disk, no longer a directory or now leading out of its area (a link swapped
in) ends the attempt as the user's error, with its name and why - a restart would fail the same way.

How they reach the attempt:

* in a sandbox (``workers.sandbox``): the worker opens each dataset's directory (``O_PATH``, never through a final
  link), checks through ``/proc/self/fd`` that what it opened lies in its area, and bubblewrap binds that very
  descriptor read-only at ``/datasets/<name>`` (what is bound is what was checked); a write fails with EROFS,
  whoever the attempt runs as;
* without one (``KILN_ISOLATION=none``): the attempt is given the dataset's own directory, writable if the
  worker's user may write it.

The trainer gets name -> path in ``KILN_DATASETS`` (JSON), for the recipe (``datasets=``) and for scripts.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from core.datasets import SHARED_AREA, DatasetPathError, area_of, check_relative, resolve
from core.trainer_protocol import ENV_DATASETS

SANDBOX_DIR = Path("/datasets")  # where a sandboxed attempt finds its datasets, one directory each


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


def open_checked(dataset: Resolved) -> int:
    """An ``O_PATH`` descriptor of the dataset's directory, checked to lie in its area now (a link swapped in since
    ``resolve_all`` is refused, as a dataset gone from its area)."""
    fd = os.open(dataset.source, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    real = os.readlink(f"/proc/self/fd/{fd}")
    area = str(dataset.area).rstrip("/")
    if real != area and not real.startswith(area + "/"):
        os.close(fd)
        raise DatasetUnavailable(f"dataset {dataset.name!r} is now {real}, outside its area {area}")
    return fd


def close_area(dataset: Resolved) -> None:
    """A team's own data area (``datasets/<team>``) closed to other uids (o-rwx, owner and group kept): a process
    of another team's that got out of its sandbox cannot reach it. The shared area stays as the operator made it."""
    if dataset.area.name == SHARED_AREA:
        return
    st = os.lstat(dataset.area)
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o007:
        os.chmod(dataset.area, stat.S_IMODE(st.st_mode) & ~0o007)


def sandboxed(datasets: list[Resolved]) -> tuple[list[tuple[int, Path]], dict[str, str]]:
    """(descriptor, where it appears in the sandbox) for each dataset, and the attempt's ``KILN_DATASETS``."""
    binds: list[tuple[int, Path]] = []
    try:
        for d in datasets:
            close_area(d)
            binds.append((open_checked(d), SANDBOX_DIR / d.name))
    except BaseException:
        for fd, _ in binds:
            os.close(fd)
        raise
    paths = {d.name: str(SANDBOX_DIR / d.name) for d in datasets}
    return binds, ({ENV_DATASETS: json.dumps(paths, sort_keys=True)} if paths else {})


def unsandboxed(datasets: list[Resolved]) -> dict[str, str]:
    """The attempt's ``KILN_DATASETS`` when it runs without a sandbox: each dataset's own directory."""
    paths = {d.name: str(d.source) for d in datasets}
    return {ENV_DATASETS: json.dumps(paths, sort_keys=True)} if paths else {}
