"""Host resources of an attempt: the kernel, not the job, bounds how much memory and how many processes it uses.

A job's spec asks for its host memory (``resources.host_memory_bytes``; by default the host's share for each of
its training processes) and the worker grants it within host-wide maxima (``KILN_ATTEMPT_MAX_MEMORY_BYTES``,
default 80% of the host's memory; ``KILN_ATTEMPT_MAX_PIDS``). How the limits are enforced is chosen once, when
the worker starts, and said in its log:

* cgroup v1 ``memory`` and ``pids`` controllers writable (a root worker on a cgroup v1 host): each attempt node
  runs in groups of its own, ``/sys/fs/cgroup/{memory,pids}/kiln/<deployment>/<host>/attempt-<id>[.node<r>]``
  (``<deployment>``: ``deployment_id``, so that two kiln deployments' workers on one host, whose attempt ids repeat,
  never share or sweep away each other's groups), joined by the
  launcher between fork and exec, so torchrun and every rank are inside before they start. The limits are
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted, so swapping does not
  dodge it) and ``pids.max`` (threads count). An attempt over its memory is OOM-killed inside its own group --
  the host and the other attempts are untouched -- and the kill is counted, so the worker reports the job as
  over its memory limit (a user error, not a host failure). The groups are removed when the attempt ends.
* otherwise rlimits on every process the attempt starts: ``RLIMIT_DATA`` (heap and private mappings) of the
  attempt's memory divided among its processes; no per-attempt process limit (``RLIMIT_NPROC`` counts every
  process of the worker's user, and root ignores it).

Every attempt also runs in a sandbox (``workers/sandbox.py``), as its team's own unprivileged uid where the worker is
root (``workers/attempt_user.py``). Which of three modes a worker is in is decided here when it starts, said in its
log and recorded on its host (``kiln hosts``):

* ``sandbox``: every attempt sandboxed;
* ``none``: the operator turned the sandbox off (``KILN_ISOLATION=none``, a single-user laptop): attempts run as the
  worker's own user, and each job says so in its events;
* ``unavailable``: the sandbox was asked for and this host cannot make one (no bubblewrap, no user namespaces for a
  worker that is not root): the host runs kiln's own recipes only, never a team's code (the scheduler places those
  jobs elsewhere), and says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import resource
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from core.settings import Settings
from workers.attempt_user import AttemptUsers
from workers.sandbox import Sandbox, SandboxUnavailable

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
DEFAULT_HOST_SHARE = 0.8  # of the host's memory, the most one attempt may use when the operator set no maximum
# The launcher (torchrun) and the worker's own bookkeeping, beyond the training processes themselves.
PIDS_BASE = 64


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    pids: int
    processes: int  # training processes on this host (the rlimit fallback divides the memory among them)


def host_max_memory(settings: Settings) -> int:
    return settings.attempt_max_memory_bytes or int(psutil.virtual_memory().total * DEFAULT_HOST_SHARE)


def limits_for(spec: Mapping[str, Any], *, processes: int, host_slots: int, settings: Settings) -> Limits:
    """The spec's own limit (``resources.host_memory_bytes``, per host) or the host's share for ``processes`` of
    its ``host_slots``, never above the host-wide maximum; processes: a fixed number per training process."""
    ceiling = host_max_memory(settings)
    asked = ((spec.get("resources") or {}).get("host_memory_bytes")) or None
    share = ceiling * max(1, processes) // max(1, host_slots, processes)
    memory = min(int(asked) if asked else share, ceiling)
    pids = min(settings.attempt_max_pids, PIDS_BASE + settings.attempt_pids_per_process * max(1, processes))
    return Limits(memory_bytes=memory, pids=pids, processes=max(1, processes))


class Confinement(Protocol):
    limits: Limits

    def enter(self) -> None:
        """In the child, between fork and exec: only system calls (no locks, no imports)."""

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the attempt for going over its memory."""

    def release(self) -> None:
        """After the attempt: nothing of it left running, its resources given back."""


class CgroupConfinement:
    def __init__(self, memory: Path, pids: Path, limits: Limits):
        self.memory, self.pids = memory, pids
        self.groups = [memory, pids]
        self.limits = limits
        # Encoded now: between fork and exec the child makes system calls only.
        self._procs = [os.fsencode(g / "cgroup.procs") for g in self.groups]

    def create(self) -> CgroupConfinement:
        for group in self.groups:
            group.mkdir(parents=True, exist_ok=True)
        _write(self.memory / "memory.limit_in_bytes", self.limits.memory_bytes)
        if (self.memory / "memory.memsw.limit_in_bytes").exists():  # swap is accounted: the limit covers it too
            _write(self.memory / "memory.memsw.limit_in_bytes", self.limits.memory_bytes)
        _write(self.pids / "pids.max", self.limits.pids)
        return self

    def enter(self) -> None:
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # 0: the writing process itself
            finally:
                os.close(fd)

    def oom_killed(self) -> bool:
        memory = self.memory
        with contextlib.suppress(OSError, ValueError):
            for line in (memory / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
            # Kernels before 4.13 do not count kills: the group having hit its limit is the closest sign.
            return int((memory / "memory.failcnt").read_text()) > 0
        return False

    def release(self) -> None:
        for _ in range(50):  # SIGKILL what is left (a rank torchrun did not reap), until the groups are empty
            pids = {p for g in self.groups for p in _pids_in(g)}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for group in self.groups:
            with contextlib.suppress(OSError):
                group.rmdir()


class RlimitConfinement:
    def __init__(self, limits: Limits):
        self.limits = limits
        self._data = max(1, limits.memory_bytes // limits.processes)

    def enter(self) -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (self._data, self._data))

    def oom_killed(self) -> bool:
        return False  # an allocation over RLIMIT_DATA fails in the process (MemoryError), it is not killed

    def release(self) -> None:
        return None


def _write(path: Path, value: int) -> None:
    path.write_text(str(value))


PROBE_GROUP = "probe"


def _probe_limits(bases: list[Path]) -> None:
    """Set limits on a group of our own, as an attempt's are set, then remove it. A host can let a group be made
    and still refuse its limits (a sandboxed kernel answered EACCES on memory.limit_in_bytes): such a host gets
    rlimits at start, not a failed launch for every attempt."""
    memory, pids = (base / PROBE_GROUP for base in bases)
    try:
        CgroupConfinement(memory, pids, Limits(memory_bytes=1 << 40, pids=PIDS_BASE, processes=1)).create()
    finally:
        for group in (memory, pids):
            with contextlib.suppress(OSError):
                group.rmdir()


def _pids_in(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


class Isolation:
    """How this worker bounds its attempts; chosen once (``detect``) and said at worker start (``describe``)."""

    def __init__(self, *, host: str, settings: Settings, host_slots: int, cgroup_bases: list[Path] | None):
        self.host = host
        self.settings = settings
        self.host_slots = max(1, host_slots)
        self.cgroup_bases = cgroup_bases  # None: rlimits
        self.cgroup_error: str | None = None  # why cgroups were present but not usable, if they were
        self.users = AttemptUsers(settings)
        self.sandbox: Sandbox | None = None
        self.sandbox_error: str | None = None  # why there is no sandbox, when one was asked for
        if settings.isolation == "sandbox":
            try:
                self.sandbox = Sandbox.detect(hidden_paths(settings), bwrap=settings.sandbox_bwrap)
            except SandboxUnavailable as exc:
                self.sandbox_error = str(exc)
                log.error("this host cannot sandbox attempts (%s): it will run kiln's own recipes only", exc)

    @classmethod
    def detect(cls, *, host: str, settings: Settings, host_slots: int, root: Path = CGROUP_ROOT) -> Isolation:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:100] or "host"
        bases = [root / c / "kiln" / deployment_id(settings) / safe for c in CONTROLLERS]
        try:
            for base in bases:
                base.mkdir(parents=True, exist_ok=True)
                if not os.access(base, os.W_OK):
                    raise PermissionError(base)
            _probe_limits(bases)
        except OSError as exc:
            log.warning("cgroup v1 memory/pids limits cannot be set here (%s): attempts get rlimits", exc)
            fallback = cls(host=host, settings=settings, host_slots=host_slots, cgroup_bases=None)
            fallback.cgroup_error = f"{type(exc).__name__}: {exc}"
            return fallback
        isolation = cls(host=host, settings=settings, host_slots=host_slots, cgroup_bases=bases)
        isolation.sweep()
        return isolation

    @property
    def mechanism(self) -> str:
        return "cgroup" if self.cgroup_bases is not None else "rlimit"

    @property
    def mode(self) -> str:
        """``sandbox``, ``none`` (turned off by the operator) or ``unavailable`` (see the module's docstring)."""
        if self.sandbox is not None:
            return "sandbox"
        return "none" if self.settings.isolation == "none" else "unavailable"

    def describe_sandbox(self) -> str:
        if self.sandbox is not None:
            return self.sandbox.describe()
        if self.mode == "none":
            return (
                "sandbox: OFF (KILN_ISOLATION=none): attempts run as the worker's own user and can read what it "
                "can; every job run here says so"
            )
        return f"sandbox: UNAVAILABLE ({self.sandbox_error}): this host runs kiln's own recipes only, no team's code"

    def describe(self) -> str:
        users = self.users.describe() if self.sandbox is not None and self.sandbox.as_root else ""
        return "; ".join(p for p in (self._describe_limits(), self.describe_sandbox(), users) if p)

    def _describe_limits(self) -> str:
        ceiling = host_max_memory(self.settings)
        if self.cgroup_bases is not None:
            where = ", ".join(str(b) for b in self.cgroup_bases)
            return (
                f"host resources: each attempt in cgroup v1 memory and pids groups under {where}; at most "
                f"{ceiling} bytes and {self.settings.attempt_max_pids} processes per attempt"
            )
        why = f" ({self.cgroup_error})" if self.cgroup_error else ""
        return (
            f"host resources: no writable cgroup v1 memory/pids controllers{why}, falling back to rlimits: "
            f"RLIMIT_DATA per process (at most {ceiling} bytes per attempt in all); the number of processes "
            "of an attempt is not limited"
        )

    def limits(self, spec: Mapping[str, Any], processes: int) -> Limits:
        return limits_for(spec, processes=processes, host_slots=self.host_slots, settings=self.settings)

    def confine(self, name: str, limits: Limits) -> Confinement:
        if self.cgroup_bases is None:
            return RlimitConfinement(limits)
        memory, pids = (b / name for b in self.cgroup_bases)
        return CgroupConfinement(memory, pids, limits).create()

    def sweep(self) -> None:
        """Remove the empty groups a worker that died (SIGKILL) left behind; a group still holding processes is
        left alone and reported."""
        for base in self.cgroup_bases or []:
            for group in base.iterdir() if base.is_dir() else []:
                if not group.is_dir():
                    continue
                if _pids_in(group):
                    log.warning("cgroup %s still holds processes of an earlier worker", group)
                    continue
                with contextlib.suppress(OSError):
                    group.rmdir()

    def close(self) -> None:
        """At worker exit: the host's own (empty) groups go too, and its deployment's when no other host uses it."""
        self.sweep()
        for base in self.cgroup_bases or []:
            for group in (base, base.parent):
                with contextlib.suppress(OSError):
                    group.rmdir()


def hidden_paths(settings: Settings) -> list[Path]:
    """What no sandbox may show, even as part of the runtime: kiln's state (the embedded default's database and
    broker files, logs, locks), the storage root (every team's files), the CLI's configuration (tokens)."""
    paths = [settings.home, settings.resolved_storage_dir, Path.home() / ".config" / "kiln"]
    for url in (settings.resolved_database_url, settings.resolved_broker_url):
        match = re.match(r"^[a-z+]*sqlite:///(.+)$", url)
        if match:
            paths.append(Path(match.group(1)).parent)
    if settings.local_tier_dir is not None:
        paths.append(settings.local_tier_dir)
    return [p.absolute() for p in paths]


def deployment_id(settings: Settings) -> str:
    """The deployment a worker serves, as a name: a digest of its database's URL, without a password read from a
    file (the embedded default's URL names its SQLite file, so each KILN_HOME is a deployment of its own)."""
    url = settings.database_url or settings.resolved_database_url
    return hashlib.sha256(url.encode()).hexdigest()[:12]


_current: Isolation | None = None


def configure(*, host: str, settings: Settings, host_slots: int) -> Isolation:
    """Called once by ``python -m workers`` before it consumes."""
    global _current
    _current = Isolation.detect(host=host, settings=settings, host_slots=host_slots)
    return _current


def current(host: str, settings: Settings) -> Isolation:
    """The worker's isolation (detected on first use where ``configure`` was not called: tests in process)."""
    return _current or configure(host=host, settings=settings, host_slots=max(1, (os.cpu_count() or 2) // 2))


def preexec(confinement: Confinement | None, first: Callable[[], None]) -> Callable[[], None]:
    """One ``preexec_fn``: ``first`` (the parent-death signal), then joining the attempt's confinement."""

    def run() -> None:
        first()
        if confinement is not None:
            confinement.enter()

    return run
