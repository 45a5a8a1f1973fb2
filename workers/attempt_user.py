"""Each team's attempts run as an unprivileged uid and gid of its own (docs/security.md, "The sandbox").

A root worker gives the attempts of team ``t`` uid and gid ``base + t``, with no setting to remember: ``base`` is
a range of kiln's own for this database (``KILN_ATTEMPT_UID_BASE`` places it by hand). The ranges lie in
0x70000000-0x7fffffff, above what hosts give to people (1000-60000), systemd's dynamic users (61184-65519) and
container ranges (``/etc/subuid``, systemd-nspawn's 0x80000-0x6fffffff), and below 2^31; each database takes one
of 2,047 slots of 131,072 uids by its uid (``core.deployment``), so every host of a deployment agrees on a team's uid
(its files on the shared storage) and two deployments on one host almost never meet (a worker refuses to start when
a uid of its range belongs to a user of the host).

The switch happens inside the sandbox (``workers.sandbox``), through ``setpriv``: no supplementary groups, no
capabilities (inheritable and bounding sets cleared), ``no_new_privs`` (a setuid binary gains nothing). The
attempt's directories (run, checkpoints, compile cache, local tier) are its uid's, 0700, so even a process that got
out of its namespaces cannot read another team's. A worker that is not root runs every attempt as its own uid.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

from core.settings import Settings

SETPRIV = "setpriv"
RANGE_START = 0x7000_0000
SLOT_SIZE = 131_072  # team ids of one deployment
SLOTS = 2_047  # RANGE_START + SLOTS * SLOT_SIZE < 2**31


@dataclass(frozen=True)
class AttemptUser:
    uid: int
    gid: int

    def drop(self) -> list[str]:
        """The command prefix that becomes this user, with nothing of root's left."""
        return [
            SETPRIV,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
        ]

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


def deployment_base(deployment: str) -> int:
    """The first uid of a deployment's range, from its database's uid."""
    slot = int(hashlib.sha256(deployment.encode()).hexdigest()[:8], 16) % SLOTS
    return RANGE_START + slot * SLOT_SIZE


class AttemptUsers:
    """Which uid a team's attempts run as on this worker, or why every attempt runs as the worker's own."""

    def __init__(self, settings: Settings) -> None:
        self.base = settings.attempt_uid_base
        self.count = settings.attempt_uid_count if self.base is not None else SLOT_SIZE
        self.why_not: str | None = None
        if os.geteuid() != 0:
            self.why_not = f"the worker is not root (uid {os.geteuid()}) and cannot switch users"
        elif shutil.which(SETPRIV) is None:
            self.why_not = "setpriv (util-linux) is not installed"

    @property
    def enabled(self) -> bool:
        return self.why_not is None

    def range_of(self, deployment: str) -> range:
        base = self.base if self.base is not None else deployment_base(deployment)
        return range(base, base + self.count)

    def check_range(self, deployment: str) -> str | None:
        """Why this deployment's range cannot be used on this host (a user of the host has a uid in it), if so."""
        if not self.enabled:
            return None
        uids = self.range_of(deployment)
        taken = sorted(p.pw_name for p in pwd.getpwall() if p.pw_uid in uids)
        if taken:
            return (
                f"the attempt uids {uids.start}-{uids.stop - 1} include users of this host ({', '.join(taken[:5])}): "
                "set KILN_ATTEMPT_UID_BASE to a free range"
            )
        return None

    def for_team(self, team_id: int, deployment: str) -> AttemptUser | None:
        if not self.enabled:
            return None
        uids = self.range_of(deployment)
        if not 0 <= team_id < len(uids):
            raise RuntimeError(f"team id {team_id} is outside the attempt uid range ({len(uids)} teams): no uid for it")
        return AttemptUser(uid=uids[team_id], gid=uids[team_id])

    def describe(self) -> str:
        if self.enabled:
            where = f"{self.base} + team id" if self.base is not None else "this deployment's range + team id"
            return f"attempt users: each team's attempts run as uid/gid {where} (setpriv inside the sandbox)"
        return f"attempt users: OFF ({self.why_not}): every attempt runs as the worker's own user"
