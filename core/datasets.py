"""Where a team's registered dataset may live: the path rules, checked at registration and again by the worker.

A dataset is a name (per team) for a directory of kiln's storage root (docs/user-code.md, "Datasets"). Its path is
relative to the storage root and lies in the data area, ``datasets/``: under ``datasets/<team>/`` (the team's own
data) or ``datasets/_shared/`` (data the operator shares with every team; ``_`` begins no team name). Nothing else
of the storage root - checkpoints, runs, logs, code archives, the database - can be named, and neither can an
absolute path, a ``..`` or a symbolic link that leads out of the area. The directory must exist when it is
registered and when an attempt starts (the worker resolves it again then: it may have vanished or been replaced).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

DATA_AREA = "datasets"
SHARED_AREA = "_shared"
MAX_PATH = 1024


class DatasetPathError(ValueError):
    """A dataset path that breaks a rule above; the message says which, and is safe to show its caller."""


def check_relative(path: str, team: str) -> PurePosixPath:
    """The path's lexical rules (no filesystem access): relative, no ``..``, in the team's or the shared area."""
    if not path or len(path) > MAX_PATH:
        raise DatasetPathError(f"a dataset path is 1 to {MAX_PATH} characters")
    if "\x00" in path or "\\" in path:
        raise DatasetPathError("a dataset path may not contain NUL or backslash characters")
    if path.startswith("/") or PurePosixPath(path).is_absolute():
        raise DatasetPathError(
            f"{path!r} is absolute: a dataset path is relative to kiln's storage root, e.g. {DATA_AREA}/{team}/NAME"
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise DatasetPathError(f"{path!r} contains '..': a dataset path may not leave its directory")
    areas = (team, SHARED_AREA)
    if len(parts) < 2 or parts[0] != DATA_AREA or parts[1] not in areas:
        raise DatasetPathError(
            f"{path!r} is not in the data area: a dataset of team {team!r} lies under {DATA_AREA}/{team}/ or "
            f"{DATA_AREA}/{SHARED_AREA}/ of kiln's storage root"
        )
    return PurePosixPath(*parts)


def area_of(storage: Path, relative: PurePosixPath) -> Path:
    """The resolved area (``datasets/<team>`` or ``datasets/_shared``) a checked relative path lies in."""
    root = Path(os.path.realpath(storage))
    return root / relative.parts[0] / relative.parts[1]


def resolve(storage: Path, path: str, team: str) -> Path:
    """The real directory a dataset path names, checked: it exists, is a directory, and its real path (every
    symbolic link followed) stays in its area of the storage root."""
    relative = check_relative(path, team)
    area = area_of(storage, relative)
    try:
        target = Path(os.path.realpath(Path(os.path.realpath(storage)) / relative))
        if not within(target, area):
            raise DatasetPathError(f"{path!r} leads out of {DATA_AREA}/{relative.parts[1]}/ (a symbolic link?)")
        if not target.exists():
            raise DatasetPathError(f"{path!r} does not exist under kiln's storage root")
        if not target.is_dir():
            raise DatasetPathError(f"{path!r} is not a directory")
    except OSError as exc:  # a name too long, a loop of links, a directory it may not search
        raise DatasetPathError(f"{path!r} cannot be resolved: {exc.strerror}") from None
    return target


def within(path: Path, area: Path) -> bool:
    return path == area or area in path.parents
