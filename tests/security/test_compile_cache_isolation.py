"""A team's compile cache is its own: the sandbox binds the attempt's own team directory of
``{storage}/compile_cache/teams`` read-write and no other, so another team's job can neither see, read, load nor
write a victim team's entries (a cache entry is code that runs: torch's pickle and the kernels in it).

Real PostgreSQL, Redis, a `python -m workers` process as root, the real sandbox, a script on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import compile_cache as store
from core.settings import get_settings
from harness.workers_cluster import Cluster, SchedulerThread, _team, wait_for
from tests.security.test_hostile_code import finished, host  # noqa: F401 - the fixture
from tests.security.test_script_isolation import script_job
from tests.support.cluster_rows import job_row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PROBE = Path(__file__).parent / "cache_probe"


def team_id(c: Cluster, name: str) -> int:
    with c.sessionmaker()() as db:
        team = _team(db, name)  # made if missing, as a submission makes it
        db.commit()
        return int(team.id)


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
