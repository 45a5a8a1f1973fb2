"""The attempt's right to commit, as a rank sees it: its node's lease (renewed by the worker) and the job's fence.

``ensure()`` is called before every training step and right before every commit or deletion of a checkpoint.
While the lease is valid it costs one clock read. Once it has expired - the worker stopped renewing it: frozen,
cut off from the database, or gone - the rank neither trains nor commits and waits for one of three things:

- the lease is renewed (the database was away and is back: the worker renewed both leases): carry on;
- the fence no longer names this attempt (the reconciler declared it LOST and revoked the fence, or a newer
  attempt claimed the job): ``FencedError`` -> exit FENCED;
- one more lease passed with neither: ``LeaseExpired`` -> exit LEASE_EXPIRED, without committing.

Waiting rather than exiting at once keeps a job alive through a database outage that outlasts the lease (the
reconciler gives the workers a lease of grace once the database is back); the bound keeps a zombie from
holding its GPUs for long when the fence cannot be written.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time
from collections.abc import Callable

from core.fence import lease_clock, read_lease
from core.telemetry import Telemetry
from core.trainer_protocol import ENV_LEASE_FILE
from trainer.checkpoint.store import FencedError

POLL_S = 0.2  # how often a rank waiting on an expired lease looks at the lease and the fence again
DEFAULT_LEASE_S = 30.0  # the wait's bound when the lease file cannot be read at all (Settings.lease_s default)


class LeaseExpired(FencedError):
    """The lease was not renewed within one more lease after it expired (-> ExitCode.LEASE_EXPIRED)."""


class LeaseGuard:
    """``path`` None: no worker holds a lease for this run (a standalone ``python -m trainer``): always valid."""

    def __init__(
        self, path: pathlib.Path | None, *, token: int | None, fence_ok: Callable[[], bool], telemetry: Telemetry
    ) -> None:
        self.path, self.token, self.fence_ok, self.tel = path, token, fence_ok, telemetry
        self._expires = float("-inf")  # cached: the file is read again only once this has passed
        self._lock = threading.Lock()  # the loop and the checkpoint writer may both wait

    @classmethod
    def from_env(cls, *, token: int | None, fence_ok: Callable[[], bool], telemetry: Telemetry) -> LeaseGuard:
        path = os.environ.get(ENV_LEASE_FILE)
        return cls(pathlib.Path(path) if path else None, token=token, fence_ok=fence_ok, telemetry=telemetry)

    def _valid(self) -> bool:
        if self.path is None or lease_clock() < self._expires:
            return True
        lease = read_lease(self.path)
        if lease is None or (self.token is not None and lease.token != self.token):
            return False  # missing, unreadable or another attempt's: no right to commit
        self._expires = lease.expires
        return lease_clock() < lease.expires

    def ensure(self, what: str) -> None:
        """Return while this attempt may train and commit; wait while its lease is expired; raise once it is
        fenced (``FencedError``) or the lease stayed expired for one more lease (``LeaseExpired``)."""
        if self._valid():
            return
        with self._lock:
            self._wait(what)

    def _wait(self, what: str) -> None:
        if self._valid():  # another thread waited for the renewal while we queued for the lock
            return
        assert self.path is not None
        last = read_lease(self.path)
        lease_s = last.lease_s if last is not None else DEFAULT_LEASE_S
        self.tel.event(
            "LEASE_EXPIRED",
            f"lease of token {self.token} expired: not training or committing ({what}) until the worker renews it",
            what=what,
            lease_s=lease_s,
            expired_s_ago=-last.remaining() if last is not None else None,
        )
        t0 = time.monotonic()
        while True:
            if not self.fence_ok():
                raise FencedError(f"the fence no longer names token {self.token} (while waiting for the lease)")
            if self._valid():
                self.tel.event(
                    "LEASE_RENEWED",
                    f"lease renewed after {time.monotonic() - t0:.1f} s: carrying on",
                    waited_s=time.monotonic() - t0,
                )
                return
            if time.monotonic() - t0 > lease_s:
                raise LeaseExpired(f"lease of token {self.token} not renewed for {lease_s:.0f} s after it expired")
            time.sleep(POLL_S)
