"""Between an attempt's claim and its trainer's start: whose uid it runs as, its code, its datasets, its sandbox.

Everything a team's attempt can reach is decided here (docs/security.md, "The sandbox"): its directories become
its team's uid's (0700) where the worker is root; its code is unpacked inside a sandbox of its own, as that uid,
into a directory only that uid owns; its datasets are opened and checked, then bound read-only; and its command
is wrapped in the sandbox with its GPUs, its MPS pipe and a lifeline to the worker. A host that cannot sandbox
refuses a team's own code (``TeamCodeRefused``); one whose operator turned the sandbox off runs it as it is.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.code_archive import EX_DATAERR, ArchiveError, artifact_path, extract
from core.settings import Settings
from core.spec import runs_team_code
from core.trainer_protocol import ENV_CODE_DIR, ENV_COMPILE_CACHE_DIR
from workers import mps
from workers.attempt_user import AttemptUser
from workers.claimed import Claimed
from workers.datasets import Resolved, resolve_all, sandboxed, unsandboxed
from workers.isolation import Isolation
from workers.sandbox import NVIDIA_CONTROL_DEVICES, Sandbox, View
from workers.supervisor import TrainerProcess

if TYPE_CHECKING:
    from core.models import GPU

UNPACK_TIMEOUT_S = 600.0
# Where every sandboxed attempt sees its job's compile cache. Inductor records paths in what it caches (a Triton
# kernel's autotuning results live beside its source file, under the Inductor cache of the process that compiled
# it): a team entry compiled by another job pointed into that job's directory, which this sandbox cannot write, and
# the hit failed (issue 40, on the H100: "Permission denied: .../compile_cache/1"). One path for every job makes a
# recorded path this job's own directory.
COMPILE_DIR_IN_SANDBOX = Path("/kiln/compile-cache")
# A GPU's device node is /dev/nvidia<minor>; the worker learns the minors from NVML when it starts.
GPU_MINORS: dict[str, int] = {}


class TeamCodeRefused(RuntimeError):
    """This host cannot sandbox, so it runs no team's own code (the scheduler places such jobs elsewhere)."""


class CodeRefused(ValueError):
    """The job's code archive breaks a rule when unpacked: the user's to fix, a restart fails the same way."""


@dataclass(frozen=True)
class AttemptDirs:
    storage: Path
    run_dir: Path
    checkpoint_dir: Path
    compile_dir: Path
    local_dir: Path | None
    local_root: Path | None  # the host's local tier, when the job has a directory in it
    # The team's compile cache (its own entries: read-write) and the admin's shared one (read-only), if any.
    team_cache_dir: Path | None = None
    shared_cache_dir: Path | None = None

    @property
    def writable(self) -> tuple[Path, ...]:
        mine = (self.run_dir, self.checkpoint_dir, self.compile_dir)
        return (*mine, *(d for d in (self.team_cache_dir, self.local_dir) if d is not None))


def prepare(proc: TrainerProcess, claimed: Claimed, dirs: AttemptDirs, host: Isolation, settings: Settings) -> None:
    """Make ``proc`` the attempt's sandboxed launch (or, with the sandbox turned off, its plain one)."""
    if host.mode == "unavailable" and runs_team_code(claimed.spec):
        raise TeamCodeRefused(f"this host cannot sandbox a team's code: {host.sandbox_error}")
    sandbox = host.sandbox
    user = host.users.for_team(claimed.team_id, claimed.deployment) if sandbox and sandbox.as_root else None
    if user is not None:
        for directory in dirs.writable:
            in_tier = directory == dirs.local_dir and dirs.local_root is not None
            user.take(directory, stop=(dirs.local_root or dirs.storage) if in_tier else dirs.storage)
        proc.log_owner = user.uid
        proc.log_line(f"running as uid {user.uid} gid {user.gid}: no capabilities, no_new_privs")
    code_dir = unpack_code(proc, claimed, dirs, sandbox, user, settings)
    datasets = resolve_all(
        names=[str(n) for n in claimed.spec.get("datasets") or []],
        registered=claimed.datasets,
        storage=dirs.storage,
        team=claimed.team,
    )
    if sandbox is None:
        proc.env.update(unsandboxed(datasets))
        proc.env["TMPDIR"] = str(dirs.run_dir)
        proc.log_line(f"NOT SANDBOXED: {host.describe_sandbox()}")
        return
    wrap(proc, claimed, dirs, sandbox, user, code_dir, datasets)


def wrap(
    proc: TrainerProcess,
    claimed: Claimed,
    dirs: AttemptDirs,
    sandbox: Sandbox,
    user: AttemptUser | None,
    code_dir: Path | None,
    datasets: list[Resolved],
) -> None:
    binds, dataset_env = sandboxed(datasets)
    proc.env.update(dataset_env)
    proc.env.update({"HOME": str(dirs.run_dir), "TMPDIR": "/tmp", "USER": "kiln", "LOGNAME": "kiln"})
    proc.env[ENV_COMPILE_CACHE_DIR] = str(COMPILE_DIR_IN_SANDBOX)
    lifeline, holder = os.pipe()
    view = View(
        writable=tuple(d for d in dirs.writable if d != dirs.compile_dir),
        renamed=((dirs.compile_dir, COMPILE_DIR_IN_SANDBOX),),
        read_only=tuple(d for d in (code_dir, dirs.shared_cache_dir) if d is not None),
        read_only_fds=tuple(binds),
        devices=gpu_devices(claimed.gpus),
        shared=mps_dirs(claimed),
        cwd=dirs.run_dir,
        lifeline_fd=lifeline,
        **gang_names(claimed),
    )
    launch = sandbox.command(proc.argv, view, user=user)
    proc.argv = launch.argv
    proc.pass_fds = [*launch.fds, *(fd for fd, _ in binds)]
    proc.lifeline = holder
    proc.sandboxed = True
    if datasets:
        proc.log_line(f"datasets {', '.join(d.name for d in datasets)} bound read-only under /datasets")
    network = "the host's (a gang's node)" if view.host_network else "loopback only"
    proc.log_line(f"sandboxed (bubblewrap): {len(view.devices)} device nodes, network {network}")


def gang_names(claimed: Claimed) -> dict[str, Any]:
    """A gang's node keeps the host's network, and a hostname of its own that every node resolves: torch's c10d
    rendezvous tells the nodes node 0's hostname (as ``MASTER_ADDR``), tells participants apart by hostname and pid
    (two nodes on one host, each pid 3 in its own PID namespace, would be one), and gloo advertises the address its
    own hostname resolves to."""
    rdzv = claimed.rendezvous
    if rdzv is None:
        return {}
    name = f"kiln-{claimed.job_id}-{claimed.attempt_number}-node{{}}"
    head = socket.gethostbyname(rdzv.endpoint.rsplit(":", 1)[0])
    hosts = [(head, name.format(0))]
    if rdzv.node_rank != 0:  # its own name first: an address's first name is what its reverse lookup gives
        hosts.insert(0, (socket.gethostbyname(claimed.address or socket.gethostname()), name.format(rdzv.node_rank)))
    return {"host_network": True, "hostname": name.format(rdzv.node_rank), "hosts": tuple(hosts)}


def gpu_devices(gpus: list[GPU]) -> tuple[Path, ...]:
    """The attempt's GPUs' device nodes and the driver's control nodes; none where the host has no NVIDIA driver
    (a CPU host, or the tests' NVML double)."""
    if not gpus or not Path("/dev/nvidiactl").exists():
        return ()
    missing = [g.uuid for g in gpus if g.uuid not in GPU_MINORS]
    if missing:
        raise RuntimeError(f"no device node known for GPU {missing[0]} (NVML gave no minor number)")
    nodes = [Path(f"/dev/nvidia{GPU_MINORS[g.uuid]}") for g in gpus]
    control = [Path("/dev") / name for name in NVIDIA_CONTROL_DEVICES if (Path("/dev") / name).exists()]
    caps = [Path("/dev/nvidia-caps")] if Path("/dev/nvidia-caps").is_dir() else []
    return (*nodes, *control, *caps)


def mps_dirs(claimed: Claimed) -> tuple[Path, ...]:
    """A GPU share's MPS pipe and log directories (its client talks to the host's daemon through them)."""
    if not any(n.get("share") for n in claimed.placement) or mps.DAEMON is None:
        return ()
    return tuple(Path(p) for p in mps.DAEMON.client_env().values())


def unpack_code(
    proc: TrainerProcess,
    claimed: Claimed,
    dirs: AttemptDirs,
    sandbox: Sandbox | None,
    user: AttemptUser | None,
    settings: Settings,
) -> Path | None:
    """The team's own code (spec ``code``): its archive from the artifact store, verified and unpacked into the
    attempt's ``code`` directory, where the trainer imports it (``KILN_CODE_DIR``). In a sandbox of its own, as
    the team's uid: the unpacking sees the archive (read-only) and the empty directory and nothing else, so an
    archive that fooled every check still writes nowhere else."""
    code = claimed.spec.get("code") or {}
    digest = code.get("digest")
    if not digest:
        return None
    archive = artifact_path(dirs.storage, claimed.team_id, digest)
    dest = dirs.run_dir / "code"
    dest.mkdir()
    if user is not None:
        os.chown(dest, user.uid, user.gid)
    if sandbox is None:
        summary = extract(archive, digest, dest, settings.archive_limits)
        entries, size = summary.entries, summary.unpacked_bytes
    else:
        entries, size = _unpack_sandboxed(sandbox, user, archive, digest, dest, settings)
    proc.env[ENV_CODE_DIR] = str(dest)
    what = (
        f"command {json.dumps(claimed.spec['command'])}"
        if claimed.spec.get("command")
        else (f"entry point {code.get('entry_point')}")
    )
    proc.log_line(f"code {digest[:12]} ({entries} entries, {size} bytes) verified and unpacked; {what}")
    return dest


def _unpack_sandboxed(
    sandbox: Sandbox, user: AttemptUser | None, archive: Path, digest: str, dest: Path, settings: Settings
) -> tuple[int, int]:
    """The archive reaches the sandbox as its standard input, opened by the worker: the team's uid never gets a
    path into the artifact store (kiln's, 0700)."""
    limits = settings.archive_limits
    argv = [
        *(sys.executable, "-m", "core.code_archive", "extract", "--archive", "-", "--digest", digest),
        *("--dest", str(dest), "--max-unpacked-bytes", str(limits.max_unpacked_bytes)),
        *("--max-entries", str(limits.max_entries)),
    ]
    launch = sandbox.command(argv, View(writable=(dest,), cwd=dest), user=user)
    try:
        with archive.open("rb") as stdin:
            done = subprocess.run(
                launch.argv,
                pass_fds=launch.fds,
                stdin=stdin,
                capture_output=True,
                text=True,
                timeout=UNPACK_TIMEOUT_S,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
    finally:
        launch.close()
    said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:400]
    if done.returncode == EX_DATAERR:
        raise CodeRefused(f"the job's code archive {digest[:12]} was refused: {said}")
    if done.returncode != 0:
        raise ArchiveError(f"unpacking the job's code archive {digest[:12]} failed: {said}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return int(summary["entries"]), int(summary["unpacked_bytes"])
