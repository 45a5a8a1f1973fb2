"""The worker chooses cgroups only where an attempt's limits can really be set (a sandboxed GPU host let the groups
be made and refused memory.limit_in_bytes: every launch failed until the probe)."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings
from workers.isolation import PROBE_GROUP, Isolation, Limits, deployment_id


def settings_at(home: Path) -> Settings:
    """No sandbox: finding one runs bubblewrap, a process (tests/security tests it); these tests are the cgroups'."""
    return Settings(home=home, isolation="none")


def test_controllers_whose_limits_can_be_set_are_used(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    iso = Isolation.detect(host="h", settings=settings_at(tmp_path), host_slots=1, root=root)
    assert iso.mechanism == "cgroup"
    # The probe set its limits as an attempt's are set (on a real cgroupfs its group is then removed).
    base = Path("kiln") / deployment_id(settings_at(tmp_path)) / "h"
    assert (root / "memory" / base / PROBE_GROUP / "memory.limit_in_bytes").read_text() == str(1 << 40)
    assert (root / "pids" / base / PROBE_GROUP / "pids.max").read_text() == "64"


def test_a_limit_the_host_refuses_means_rlimits_and_the_worker_says_why(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    # A limit file that cannot be written (a directory here; EACCES on the sandboxed host).
    base = Path("kiln") / deployment_id(settings_at(tmp_path)) / "h"
    (root / "memory" / base / PROBE_GROUP / "memory.limit_in_bytes").mkdir(parents=True)
    iso = Isolation.detect(host="h", settings=settings_at(tmp_path), host_slots=1, root=root)
    assert iso.mechanism == "rlimit"
    assert "memory.limit_in_bytes" in iso.describe()
    assert "falling back to rlimits" in iso.describe()


def test_two_deployments_on_one_host_never_share_an_attempts_groups(tmp_path: Path) -> None:
    """Attempt ids repeat across deployments (each database counts from 1): two kiln instances' workers on one host
    (CI's e2e groups side by side, or a second `kiln up`) once shared /sys/fs/cgroup/memory/kiln/<host>/attempt-5,
    and one set the other's limits under a running job (a launch failed with EINVAL)."""
    root = tmp_path / "cgroup"
    limits = Limits(memory_bytes=1 << 30, pids=64, processes=1)
    groups = []
    for name in ("a", "b"):
        settings = settings_at(tmp_path / name)
        iso = Isolation.detect(host="vm", settings=settings, host_slots=1, root=root)
        confined = iso.confine("attempt-5", limits)
        groups.append(confined.memory)  # type: ignore[union-attr]
    assert groups[0] != groups[1] and groups[0].name == groups[1].name == "attempt-5"
