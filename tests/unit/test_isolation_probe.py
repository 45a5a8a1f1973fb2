"""The worker chooses cgroups only where an attempt's limits can really be set (a sandboxed GPU host let the groups
be made and refused memory.limit_in_bytes: every launch failed until the probe)."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings
from workers.isolation import PROBE_GROUP, Isolation


def test_controllers_whose_limits_can_be_set_are_used(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    iso = Isolation.detect(host="h", settings=Settings(home=tmp_path), host_slots=1, root=root)
    assert iso.mechanism == "cgroup"
    # The probe set its limits as an attempt's are set (on a real cgroupfs its group is then removed).
    assert (root / "memory" / "kiln" / "h" / PROBE_GROUP / "memory.limit_in_bytes").read_text() == str(1 << 40)
    assert (root / "pids" / "kiln" / "h" / PROBE_GROUP / "pids.max").read_text() == "64"


def test_a_limit_the_host_refuses_means_rlimits_and_the_worker_says_why(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    # A limit file that cannot be written (a directory here; EACCES on the sandboxed host).
    (root / "memory" / "kiln" / "h" / PROBE_GROUP / "memory.limit_in_bytes").mkdir(parents=True)
    iso = Isolation.detect(host="h", settings=Settings(home=tmp_path), host_slots=1, root=root)
    assert iso.mechanism == "rlimit"
    assert "memory.limit_in_bytes" in iso.describe()
    assert "falling back to rlimits" in iso.describe()
