"""The checkpoint tiers of a job: the durable directory, an optional host-local one, and which a path is in."""

from __future__ import annotations

import pathlib

LOCAL, DURABLE = "local", "durable"


class Tiers:
    """Where a job's checkpoints live: ``root`` (durable, shared by all attempts) and ``local_root`` (host-local,
    optional)."""

    root: pathlib.Path
    local_root: pathlib.Path | None

    def roots(self) -> list[pathlib.Path]:
        return [self.root] if self.local_root is None else [self.local_root, self.root]

    @property
    def write_root(self) -> pathlib.Path:
        """Where save() commits: the local tier when there is one."""
        return self.local_root if self.local_root is not None else self.root

    def tier_of(self, path: pathlib.Path) -> str:
        return LOCAL if self.local_root is not None and path.parent == self.local_root else DURABLE
