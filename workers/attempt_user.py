"""Each team's attempts run as an unprivileged user of its own (docs/security.md, "What a job can reach").

With ``KILN_ATTEMPT_UID_BASE`` set and the worker running as root, the attempt of team ``t`` runs as uid and gid
``base + t`` (team ids below ``KILN_ATTEMPT_UID_COUNT``), started through ``setpriv``: no supplementary groups,
no capabilities (inheritable and bounding sets cleared) and ``no_new_privs`` (a setuid binary gains nothing). The
worker keeps root to switch. The attempt's directories (run, checkpoints, compile cache, local tier) are that
uid's, 0700, so another team's attempt cannot read or change them; the directories above them are traversable
(0711) but not listable; the code it runs is root's and read-only to it; its HOME and TMPDIR are in its run
directory. The worker's settings never reach it (``workers.tasks.attempt_env``), and the database, the broker's
file and the worker's own process are root's alone. Where kiln cannot switch users (not root, no setpriv, the
setting unset) attempts run as the worker's user, and the worker says so when it starts.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from core.settings import Settings

SETPRIV = "setpriv"


@dataclass(frozen=True)
class AttemptUser:
    uid: int
    gid: int

    def command(self, argv: list[str]) -> list[str]:
        return [
            SETPRIV,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            *argv,
        ]

    def env(self, run_dir: Path) -> dict[str, str]:
        name = f"kiln-{self.uid}"
        return {"HOME": str(run_dir), "TMPDIR": str(run_dir / "tmp"), "USER": name, "LOGNAME": name}

    def take(self, directory: Path, *, stop: Path) -> None:
        """``directory`` becomes this user's (0700, as is every file already in it); its ancestors below ``stop``
        (a kiln directory) become traversable, not listable, by others."""
        directory.mkdir(parents=True, exist_ok=True)
        if os.lstat(directory).st_uid != self.uid:
            # Walked only while the worker still owns it (nothing of the user's can be in it yet): in a directory
            # the user owns, another of its processes could swap a subdirectory for a link mid-walk and have root
            # hand it any file of the host.
            for root, dirs, files in os.walk(directory):
                for name in [*dirs, *files]:
                    os.lchown(os.path.join(root, name), self.uid, self.gid)
        os.chown(directory, self.uid, self.gid)
        os.chmod(directory, 0o700)
        parent = directory.parent
        while parent != stop.parent and stop in (parent, *parent.parents):
            os.chmod(parent, os.stat(parent).st_mode & 0o7777 | 0o711)
            parent = parent.parent

    @staticmethod
    def readable(path: Path) -> None:
        """A file or tree the worker writes for the attempt to read, not to change (its spec, code, fence, lease):
        the worker's, world-readable (it lies in the attempt's 0700 directories, so no one else reaches it)."""
        if not path.exists():
            return
        for root, dirs, files in os.walk(path) if path.is_dir() else []:
            for d in dirs:
                os.lchown(os.path.join(root, d), 0, 0)
                os.chmod(os.path.join(root, d), 0o755)
            for f in files:
                os.lchown(os.path.join(root, f), 0, 0)
                if not os.path.islink(os.path.join(root, f)):
                    os.chmod(os.path.join(root, f), 0o644)
        os.lchown(path, 0, 0)
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def closed_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` that other users cannot enter (not o+x), if any."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & 0o001:
            return parent
    return None


class AttemptUsers:
    """The uid range, or why there is none."""

    def __init__(self, settings: Settings) -> None:
        self.base = settings.attempt_uid_base
        self.count = settings.attempt_uid_count
        self.why_not: str | None = None
        if self.base is None:
            self.why_not = "KILN_ATTEMPT_UID_BASE is not set"
        elif os.geteuid() != 0:
            self.why_not = f"the worker is not root (uid {os.geteuid()}) and cannot switch users"
        elif shutil.which(SETPRIV) is None:
            self.why_not = "setpriv (util-linux) is not installed"

    @property
    def enabled(self) -> bool:
        return self.why_not is None

    def for_team(self, team_id: int) -> AttemptUser | None:
        if self.base is None or not self.enabled:
            return None
        if not 0 <= team_id < self.count:
            raise RuntimeError(f"team id {team_id} is outside KILN_ATTEMPT_UID_COUNT ({self.count}): no uid for it")
        return AttemptUser(uid=self.base + team_id, gid=self.base + team_id)

    def describe(self) -> str:
        if self.enabled:
            assert self.base is not None
            closed = closed_ancestor(Path(os.path.realpath(sys.executable)))
            warning = (
                ""
                if closed is None
                else (
                    f"; WARNING: the interpreter {os.path.realpath(sys.executable)} lies under {closed}, which other "
                    "users cannot enter: an attempt of several processes (torchrun) cannot start its ranks"
                )
            )
            return (
                f"attempt users: each team's attempts run as uid/gid {self.base} + team id (setpriv, no "
                f"capabilities, no_new_privs, 0700 directories){warning}"
            )
        return (
            f"attempt users: OFF ({self.why_not}): every attempt runs as the worker's own user, so one team's "
            "attempt can read another's files on this host"
        )
