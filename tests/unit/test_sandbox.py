"""The sandbox an attempt gets (workers/sandbox.py) as bubblewrap's command line, and the uids teams get
(workers/attempt_user.py): what is bound, how, and what never is. No process is started here; tests/security/
runs hostile code in real sandboxes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.settings import Settings
from workers.attempt_user import RANGE_START, SLOT_SIZE, SLOTS, AttemptUser, AttemptUsers, deployment_base
from workers.sandbox import Launch, Sandbox, View, runtime_paths

ROOT = Path(__file__).resolve().parents[2]
VENV = Path("/opt/venv")
BASE = Path("/opt/python")
PACKAGES = tuple(ROOT / p for p in ("core", "rank", "workers", "trainer"))


def sandbox(*, as_root: bool = True) -> Sandbox:
    return Sandbox(bwrap="/usr/bin/bwrap", as_root=as_root, runtime=(BASE, VENV), packages=PACKAGES)


def binds(argv: list[str]) -> dict[str, list[tuple[str, str]]]:
    """bwrap's binds by kind, up to the ``--`` that ends its options."""
    out: dict[str, list[tuple[str, str]]] = {}
    end = argv.index("--")
    i = 0
    while i < end:
        if argv[i] in ("--bind", "--ro-bind", "--dev-bind", "--ro-bind-fd", "--symlink", "--ro-bind-data"):
            out.setdefault(argv[i], []).append((argv[i + 1], argv[i + 2]))
            i += 3
        else:
            i += 1
    return out


def command(view: View, **kw: bool) -> Launch:
    user = AttemptUser(uid=RANGE_START + 7, gid=RANGE_START + 7) if kw.get("as_root", True) else None
    return sandbox(**kw).command(["python", "-m", "rank.entry"], view, user=user)


def test_an_attempt_sees_the_runtime_read_only_and_only_its_own_directories_writable(tmp_path: Path) -> None:
    run, ckpt, code = (
        tmp_path / "runs" / "5" / "1",
        tmp_path / "checkpoints" / "5",
        tmp_path / "runs" / "5" / "1" / "code",
    )
    launch = command(View(writable=(run, ckpt), read_only=(code,), cwd=run))
    try:
        b = binds(launch.argv)
        assert b["--bind"] == [(str(run), str(run)), (str(ckpt), str(ckpt))]
        ro = dict(b["--ro-bind"])
        assert {str(p) for p in (BASE, VENV, *PACKAGES, code)} <= set(ro)
        assert all(src == dst for src, dst in b["--ro-bind"])
        # the code is bound read-only after (over) the run directory that holds it
        assert launch.argv.index(str(code)) > launch.argv.index(str(run))
        assert str(ROOT) not in ro and str(tmp_path) not in ro  # never a whole source tree or the storage root
        assert "--dev-bind" not in b
        opts = launch.argv[: launch.argv.index("--")]
        for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--new-session"):
            assert flag in opts
        assert "--unshare-user" not in opts  # root sets up; setpriv then drops to the team's uid
        assert opts[opts.index("--tmpfs") - 2 : opts.index("--tmpfs") + 2] == ["--perms", "1777", "--tmpfs", "/tmp"]
        assert opts[opts.index("/dev/shm") - 1 : opts.index("/dev/shm") + 1] == ["--tmpfs", "/dev/shm"]
    finally:
        launch.close()


def test_the_team_uid_is_taken_inside_with_nothing_of_roots_left_and_a_lifeline_to_the_worker() -> None:
    lifeline, holder = os.pipe()
    launch = command(View(lifeline_fd=lifeline))
    try:
        inner = launch.argv[launch.argv.index("--") + 1 :]
        uid = RANGE_START + 7
        assert inner[:9] == [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
        assert inner[10:14] == ["-m", "workers.sandbox_shim", "--lifeline", str(lifeline)]
        assert inner[-3:] == ["python", "-m", "rank.entry"]
        assert lifeline in launch.fds
        files = {dst: os.read(int(fd), 4096).decode() for fd, dst in binds(launch.argv)["--ro-bind-data"]}
        assert f"kiln:x:{uid}:{uid}:" in files["/etc/passwd"] and "root:x:0:0:" in files["/etc/passwd"]
        assert "kiln-attempt" in files["/etc/hosts"]  # its own hostname resolves in its own network namespace
    finally:
        launch.close()
        os.close(holder)


def test_a_gang_node_keeps_the_hosts_network_and_an_unprivileged_worker_uses_a_user_namespace() -> None:
    launch = command(View(host_network=True), as_root=False)
    try:
        opts = launch.argv[: launch.argv.index("--")]
        assert "--unshare-net" not in opts
        assert opts[opts.index("--unshare-user") + 1] == "--disable-userns"
        assert "setpriv" not in launch.argv
    finally:
        launch.close()


def test_only_the_attempts_gpus_and_datasets_are_bound(tmp_path: Path) -> None:
    devices = (Path("/dev/nvidia3"), Path("/dev/nvidiactl"), Path("/dev/nvidia-uvm"))
    launch = command(View(devices=devices, read_only_fds=((511, Path("/datasets/digits")),)))
    try:
        b = binds(launch.argv)
        assert b["--dev-bind"] == [(str(d), str(d)) for d in devices]
        assert b["--ro-bind-fd"] == [("511", "/datasets/digits")]
        assert not any("nvidia0" in a for a in launch.argv)
    finally:
        launch.close()


def test_the_runtime_never_holds_kilns_state_nor_a_whole_source_tree(tmp_path: Path) -> None:
    runtime, packages = runtime_paths((ROOT / ".kiln", Path.home() / ".config" / "kiln"))
    assert ROOT not in runtime and not any(p in ROOT.parents for p in runtime)
    assert all(not (ROOT / ".kiln").is_relative_to(p) for p in runtime)
    if (ROOT / ".venv").is_dir() and Path(os.sys.prefix).resolve() == (ROOT / ".venv").resolve():
        assert (ROOT / ".venv").resolve() in runtime
        assert set(packages) == set(PACKAGES)


def test_every_deployment_gets_a_uid_range_of_its_own_above_people_and_containers() -> None:
    bases = {deployment_base(f"{i:032x}") for i in range(500)}
    assert len(bases) > 400  # 500 databases, 2,047 slots: few meet
    assert all(b >= RANGE_START and b + SLOT_SIZE <= RANGE_START + SLOTS * SLOT_SIZE <= 2**31 for b in bases)
    users = AttemptUsers(Settings())
    if users.enabled:
        assert users.for_team(3, "ab" * 16) == AttemptUser(
            deployment_base("ab" * 16) + 3, deployment_base("ab" * 16) + 3
        )
        with pytest.raises(RuntimeError, match="outside the attempt uid range"):
            users.for_team(SLOT_SIZE, "ab" * 16)


def test_a_range_that_holds_a_hosts_user_is_refused() -> None:
    users = AttemptUsers(Settings(attempt_uid_base=65000, attempt_uid_count=1000))  # holds nobody (65534)
    if not users.enabled:
        pytest.skip("the worker switches users only as root")
    clash = users.check_range("ab" * 16)
    assert clash is not None and "nobody" in clash and "KILN_ATTEMPT_UID_BASE" in clash
    assert AttemptUsers(Settings()).check_range("ab" * 16) is None


def test_a_gang_node_names_itself_and_node_0_first_in_its_hosts() -> None:
    """torch's c10d rendezvous names a node by the reverse lookup of its address and hands node 0's name out as the
    address to meet at: two nodes on one host (each pid 3 in its own PID namespace) once waited for ever as one."""
    hosts = (("10.0.0.6", "kiln-5-1-node1"), ("10.0.0.5", "kiln-5-1-node0"))
    launch = command(View(host_network=True, hostname="kiln-5-1-node1", hosts=hosts))
    try:
        opts = launch.argv[: launch.argv.index("--")]
        assert opts[opts.index("--hostname") + 1] == "kiln-5-1-node1"
        files = {dst: os.read(int(fd), 65536).decode() for fd, dst in binds(launch.argv)["--ro-bind-data"]}
        assert files["/etc/hosts"].startswith("10.0.0.6 kiln-5-1-node1\n10.0.0.5 kiln-5-1-node0\n")
    finally:
        launch.close()


def test_every_job_sees_its_own_compile_cache_at_one_path(tmp_path: Path) -> None:
    """Inductor records paths in what it caches (a Triton kernel's autotuning results beside its source, under the
    compiling process's cache dir). A team entry compiled by job 1 and loaded by job 2 pointed into job 1's directory,
    which job 2's sandbox cannot write, and the hit failed on the H100 (issue 40). So every attempt sees its own
    job's compile cache at one path, and the trainer is told that path."""
    from types import SimpleNamespace

    from workers.attempt_setup import COMPILE_DIR_IN_SANDBOX, AttemptDirs, wrap
    from workers.supervisor import TrainerProcess

    for job in (1, 2):
        storage = tmp_path / "storage"
        dirs = AttemptDirs(
            storage=storage,
            run_dir=storage / "runs" / str(job) / "1",
            checkpoint_dir=storage / "checkpoints" / str(job),
            compile_dir=storage / "compile_cache" / str(job),
            local_dir=None,
            local_root=None,
        )
        dirs.run_dir.mkdir(parents=True)
        proc = TrainerProcess(
            ["python", "-m", "rank.entry"],
            env={},
            log_path=tmp_path / f"{job}.log",
            run_dir=dirs.run_dir,
            cwd=dirs.run_dir,
        )
        claimed = SimpleNamespace(gpus=[], placement=[], rendezvous=None)
        wrap(proc, claimed, dirs, sandbox(), None, None, [])  # type: ignore[arg-type]
        b = binds(proc.argv)
        assert (str(dirs.compile_dir), str(COMPILE_DIR_IN_SANDBOX)) in b["--bind"]
        assert all(src != str(dirs.compile_dir) or dst == str(COMPILE_DIR_IN_SANDBOX) for src, dst in b["--bind"])
        assert proc.env["KILN_COMPILE_CACHE_DIR"] == str(COMPILE_DIR_IN_SANDBOX)
        for fd in proc.pass_fds:
            os.close(fd)
        if proc.lifeline is not None:
            os.close(proc.lifeline)
