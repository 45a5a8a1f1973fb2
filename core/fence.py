"""The two files through which the control plane takes a trainer's right to commit away: the fence and the lease.

A trainer may commit a checkpoint only while both hold:

- the **fence** file in the job's checkpoint directory (shared storage) names the attempt's fencing token. The
  worker writes it when an attempt claims the job; the reconciler revokes it when it declares the attempt LOST
  (after that transaction commits), so an attempt that is still alive stops at its next commit wherever it runs;
- the **lease** file in the node's run directory has not expired. The worker renews it beside the database lease
  after every heartbeat that renewed the database lease, and only then; so a worker that is frozen, partitioned
  from the database or dead stops renewing both, and its ranks stop committing on their own before the
  reconciler can declare the attempt lost, even if the fence cannot be written (storage unreachable from the
  scheduler's host). The expiry is on the host's boot-time clock, which the worker and its ranks share and
  which keeps counting while a process (or the whole machine) is stopped; each host's worker writes the lease
  of its own ranks only, so no clock is compared across hosts.

Pure Python, no database: the worker, the reconciler and the trainer all import it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from core.private import read_regular, replace_file
from core.trainer_protocol import FENCE_FILE

REVOKED = "revoked:"  # the fence of a lost attempt: matches no token until the next attempt claims the job
UNREADABLE = "unreadable"  # a fence that is not a regular file: matches no token


def job_checkpoint_dir(storage_dir: Path, job_id: int) -> Path:
    """The job's checkpoints, shared by all its attempts on every host (the fence file lives there)."""
    return storage_dir / "checkpoints" / str(job_id)


def read_fence(checkpoint_dir: Path) -> str | None:
    """The fence's content (a token in decimal, or ``revoked:<token>``); None when no control plane wrote one.
    Anything but a regular file there (a job's own doing: the directory is its user's) names no token."""
    try:
        return read_regular(checkpoint_dir / FENCE_FILE).decode(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError:
        return UNREADABLE


def fence_names(checkpoint_dir: Path, token: int | None) -> bool:
    """True while the fence names ``token`` (or there is no fence, or no token: a run with no control plane)."""
    if token is None:
        return True
    current = read_fence(checkpoint_dir)
    return current is None or current == str(token)


def write_fence(checkpoint_dir: Path, token: int) -> None:
    """Name ``token`` in the job's checkpoint directory before any rank of its attempt starts."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    replace_file(checkpoint_dir / FENCE_FILE, str(token), durable=True)


def revoke_fence(checkpoint_dir: Path, token: int) -> bool:
    """Make the fence name no attempt, if it still names ``token``; True when it did.

    Never creates the directory (a scheduler without the shared storage mounted writes nothing) and never
    touches a fence that a newer attempt has already claimed: the next attempt starts only after the revoking
    transaction committed and a backoff passed, and it writes its own token.
    """
    if read_fence(checkpoint_dir) != str(token):
        return False
    replace_file(checkpoint_dir / FENCE_FILE, f"{REVOKED}{token}", durable=True)
    return True


# ------------------------------------------------------------------------------------------------------ lease


def lease_clock() -> float:
    """Seconds on the host's boot-time clock: shared by every process of the host, never set back, and still
    counting while a process or the machine is suspended (a frozen worker's lease runs out all the same)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


# The trainer's lease ends this fraction of a lease before the database's (both start at the same renewal): room
# for a rank's last check before its rename, and for the scheduler's clock running ahead of the worker's.
LEASE_MARGIN = 0.1


@dataclass(frozen=True)
class Lease:
    token: int
    expires: float  # on lease_clock()
    lease_s: float  # the lease's length: how long one renewal lasts

    def remaining(self) -> float:
        return self.expires - lease_clock()

    @classmethod
    def renewed(cls, *, token: int, at: float, lease_s: float) -> Lease:
        """The lease a worker hands its ranks for a database lease renewed at ``at`` (``lease_clock()`` read
        before the renewing transaction, so it never outlasts the database's)."""
        return cls(token=token, expires=at + lease_s * (1 - LEASE_MARGIN), lease_s=lease_s)


def write_lease(path: Path, lease: Lease) -> None:
    """Atomically replace the lease file (no fsync: it is renewed every heartbeat and read on this host only)."""
    # 0644, the worker's: the attempt's own user reads it (workers/attempt_user.py) in its 0700 run directory, where
    # it could plant a link at a predictable temporary name; replace_file never writes through one.
    replace_file(path, json.dumps({"token": lease.token, "expires": lease.expires, "lease_s": lease.lease_s}))


def read_lease(path: Path) -> Lease | None:
    """The lease as last written; None when the file is missing or unreadable (which a reader treats as
    expired: the worker writes it before it launches the ranks)."""
    try:
        data = json.loads(path.read_text())
        return Lease(token=int(data["token"]), expires=float(data["expires"]), lease_s=float(data["lease_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
