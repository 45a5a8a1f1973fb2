"""A script that exits 1 shows 1 beside its attempt, in the dashboard and in ``kiln describe`` alike (issue 42, point
7): the attempt records kiln's code (USER_ERROR, 2, for any failing command), rank 0's EXIT event the command's own."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from api.routers.dashboard.job import overview_of
from cli.commands.jobs import _with_command_exit_codes
from core.event_types import EventType
from core.settings import Settings
from core.trainer_protocol import ExitCode, command_exit_code
from core.transitions import record_event
from harness.workers_cluster import admit, submit, tiny_spec
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration


def test_the_dashboard_and_describe_show_the_commands_own_exit_code(db: Session) -> None:
    agent = HostAgent(name="exitcode-h", inventory=NoGpus(), cpu_slots=2, address=None, settings=Settings())
    host = agent.register(db)
    db.flush()
    job = submit(db, tiny_spec("exits-one"))
    attempt = admit(db, job, host)
    attempt.exit_code = int(ExitCode.USER_ERROR)
    data = {"attempt": attempt.number, "rank": 0, "exit_code": 2, "returncode": 1}
    record_event(db, EventType.EXIT, job=job, message="the command exited with 1", data=data)
    record_event(db, EventType.EXIT, job=job, message="rank 1", data={**data, "rank": 1, "returncode": 3})
    db.flush()

    shown = overview_of(db, job)["attempts"]
    assert [a["exit_code"] for a in shown] == [1]

    events = [{"type": "EXIT", "data": data}, {"type": "EXIT", "data": {**data, "rank": 1, "returncode": 3}}]
    rows = _with_command_exit_codes([{"number": attempt.number, "exit_code": 2}], events)
    assert [r["exit_code"] for r in rows] == [1]


def test_a_recipes_exit_keeps_the_trainers_code() -> None:
    assert command_exit_code("EXIT", {"attempt": 1, "rank": 0, "exit_code": 3}) is None
    assert command_exit_code("FAILED", {"attempt": 1, "returncode": 1}) is None
    assert command_exit_code("EXIT", {"attempt": 2, "rank": 0, "returncode": 0}) == (2, 0)
