"""A team's compile cache is its own: the sandbox binds the attempt's own team directory of
``{storage}/compile_cache/teams`` read-write and no other, so another team's job can neither see, read, load nor
write a victim team's entries (a cache entry is code that runs: torch's pickle and the kernels in it).

Real PostgreSQL, Redis, a `python -m workers` process as root, the real sandbox, a script on the CPU.

And what a team's code puts in its own directory stays its own: root reads that directory (an admin's ``promote``,
the scheduler leader's collection), so a link there to a host file or directory, or a FIFO, is never followed,
opened or deleted through. These are plain calls, as root runs them, with the team's planted files."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from core import compile_cache as store
from core.settings import get_settings
from harness.workers_cluster import Cluster, SchedulerThread, _team, wait_for
from tests.security.test_hostile_code import finished, host  # noqa: F401 - the fixture
from tests.security.test_script_isolation import script_job
from tests.support.cluster_rows import job_row

PROBE = Path(__file__).parent / "cache_probe"


def team_id(c: Cluster, name: str) -> int:
    with c.sessionmaker()() as db:
        team = _team(db, name)  # made if missing, as a submission makes it
        db.commit()
        return int(team.id)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_another_teams_job_never_sees_a_teams_compile_cache(host: Cluster) -> None:  # noqa: F811
    c = host
    c.start_worker("a", cpu_slots=2)
    storage = get_settings().resolved_storage_dir
    victim = store.team_dir(storage, team_id(c, "victims"))
    entry = store.Entry.for_blob(
        {"graph": "victim's"}, b"victim's artifacts", job_id="1", attempt="1", cold_compile_s=9.0
    )
    assert store.publish(victim, entry, b"victim's artifacts")
    victim.chmod(0o700)  # as the worker leaves a team's directory (its uid's, 0700)
    sched = SchedulerThread(c.sessionmaker(), get_settings(), interval_s=0.5).start()
    try:
        job = script_job(c, "attackers", PROBE, ["python", "train.py", str(victim), entry.key], "probe")
        wait_for(lambda: finished(c, job), 240, "the other team's script finished")
    finally:
        sched.stop()

    row = job_row(c, job)
    log = (storage / "logs" / str(job) / "1.log").read_text()
    assert row.state == "SUCCEEDED", (row.exit_reason, log)
    seen = json.loads(next(line for line in log.splitlines() if "PROBE " in line).split("PROBE ", 1)[1])
    own = store.team_dir(storage, team_id(c, "attackers"))
    assert seen["own"] == str(own) and seen["own_writable"] is True  # its own team's cache: there, writable
    assert seen["victim_visible"] is False, log  # the victim's directory is not in its view at all
    assert seen["teams"] == [own.name], log  # of the teams' caches it sees only its own
    assert str(seen["victim_blob"]).startswith("DENIED") and str(seen["victim_write"]).startswith("DENIED"), log
    assert store.read(victim, entry.key) is not None and not (victim / "planted").exists()
    assert own.stat().st_uid >= 0x7000_0000 and own.stat().st_mode & 0o777 == 0o700  # the team's uid's alone


def planted_entry(storage: Path, team: int) -> tuple[Path, store.Entry]:
    entry = store.Entry.for_blob({"graph": "team's"}, b"team's artifacts", job_id="1", attempt="1", cold_compile_s=9.0)
    assert store.publish(store.team_dir(storage, team), entry, b"team's artifacts")
    return store.team_dir(storage, team) / entry.key, entry


def promote_within(storage: Path, key: str, fifo: Path, seconds: float) -> BaseException | bool:
    """``promote``'s result or exception; a failed test if it still runs after ``seconds``, blocked opening the FIFO
    (a writer's open ends the reader's wait, so the thread ends too)."""
    got: list[BaseException | bool] = []

    def run() -> None:
        try:
            got.append(store.promote(storage, 5, key))
        except Exception as exc:
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=seconds)
        pytest.fail(f"promote opened a link to a host FIFO and blocked; then it ended with {got}")
    return got[0]


@pytest.mark.parametrize(("name", "check"), [(store.BLOB, "digest"), (store.ENTRY, "entry")])
def test_promote_refuses_a_link_to_a_host_file_without_opening_it(tmp_path: Path, name: str, check: str) -> None:
    """The link's target is a FIFO with no writer, standing for a host file the team may not read (kiln's SQLite
    database, /etc/shadow): root opening it to read would block the admin's command for ever."""
    storage, host_file = tmp_path / "storage", tmp_path / "host" / "kiln.db"
    host_file.parent.mkdir()
    os.mkfifo(host_file, 0o600)
    where, entry = planted_entry(storage, 5)
    (where / name).unlink()
    (where / name).symlink_to(host_file)
    got = promote_within(storage, entry.key, host_file, seconds=10)
    assert isinstance(got, store.Rejected) and got.check == check, got
    assert str(got) == f"{name} is a link, not a file kiln wrote"  # nothing said about the host file
    assert not (store.shared_dir(storage) / entry.key).exists()
    with pytest.raises(OSError) as info:  # no reader holds the FIFO open
        os.open(host_file, os.O_WRONLY | os.O_NONBLOCK)
    assert info.value.errno == errno.ENXIO


def test_collection_removes_a_key_linked_outside_and_leaves_the_outside_alone(tmp_path: Path) -> None:
    storage, outside = tmp_path / "storage", tmp_path / "host" / "state"
    outside.mkdir(parents=True)
    (outside / "kiln.db").write_bytes(b"kiln's database")
    (outside / "keep").mkdir()
    (outside / "keep" / "file").write_bytes(b"kept")
    old = time.time() - 90 * 86400
    os.utime(outside, (old, old))  # followed, the link would look unused for 90 days
    where, entry = planted_entry(storage, 5)
    team = where.parent
    (team / ("a" * 32)).symlink_to(outside)  # a key directory that is a link to a host directory
    (team / ("b" * 32)).symlink_to(outside / "kiln.db")  # a key that is a link to a host file
    got = store.collect(storage, max_age_s=30 * 86400, quota_bytes=10**9)
    assert got.entries == 2 and got.bytes == len(str(outside)) + len(str(outside / "kiln.db"))  # the links' sizes
    assert [p.name for p in team.iterdir()] == [entry.key]  # the links unlinked, no .gone- link left; the entry kept
    assert (outside / "kiln.db").read_bytes() == b"kiln's database"
    assert (outside / "keep" / "file").read_bytes() == b"kept"
    assert sorted(p.name for p in outside.iterdir()) == ["keep", "kiln.db"]


def test_a_gone_or_tmp_link_left_from_before_is_swept(tmp_path: Path) -> None:
    storage, outside = tmp_path / "storage", tmp_path / "host" / "state"
    outside.mkdir(parents=True)
    (outside / "kiln.db").write_bytes(b"kiln's database")
    where, entry = planted_entry(storage, 5)
    team = where.parent
    old = time.time() - 2 * store.STALE_TMP_S
    os.utime(outside, (old, old))
    for name in (f"{store.GONE_PREFIX}{'a' * 32}-0123456789ab", f"{store.TMP_PREFIX}{'b' * 32}-0123456789ab"):
        (team / name).symlink_to(outside)
        os.utime(team / name, (old, old), follow_symlinks=False)  # left an hour and more ago
    assert store.collect(storage, max_age_s=30 * 86400, quota_bytes=10**9).entries == 0
    assert [p.name for p in team.iterdir()] == [entry.key]
    assert [p.name for p in outside.iterdir()] == ["kiln.db"]
    assert (outside / "kiln.db").read_bytes() == b"kiln's database"
