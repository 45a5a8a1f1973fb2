"""What the API returns is shown as text on a terminal: never markup, never terminal control.

Before: event messages were rendered as rich markup by the CLI (a cancel reason became a clickable link;
``[/bogus]`` crashed ``kiln events``), and control characters from events and logs reached the terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from core.db import make_engine
from core.models import Attempt
from harness.dashboard import ROOT
from tests.security.live import Live

pytestmark = pytest.mark.e2e

# A link in rich's markup, a closing tag that matches nothing, a raw OSC 8 hyperlink, "clear the screen", and a
# right-to-left override that would show the rest reversed.
NASTY = (
    "[link=https://evil.example]click me[/link] [/bogus] \x1b]8;;https://evil.example\x07osc\x1b]8;;\x07 "
    "\x1b[2J\u202eevil"
)
FORBIDDEN = (b"\x1b]8;", b"\x1b[2J", "\u202e".encode())


def in_terminal(live: Live, *args: str) -> tuple[int, bytes]:
    """``kiln ARGS`` with its output on a pseudo-terminal, as a person runs it."""
    env = {
        **os.environ,
        "KILN_API_URL": live.kiln.url,
        "KILN_TOKEN": live.kiln.token,
        "COLUMNS": "400",
        "XDG_CONFIG_HOME": str(live.kiln.home / "xdg"),
        "TERM": "xterm-256color",
    }
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=30), out


@pytest.fixture(scope="module")
def nasty_job(live: Live) -> int:
    """A job cancelled with the nasty reason, whose attempt's log holds the same line."""
    example = (ROOT / "examples" / "gpt-tiny.yaml").read_text().replace("name: gpt-tiny", "name: nasty")
    with live.kiln.api() as api:
        job = int(api.post("/v1/jobs", content=example, headers={"Content-Type": "application/yaml"}).json()["id"])
        engine = make_engine(live.kiln.env["KILN_DATABASE_URL"])
        with Session(engine) as db:
            db.add(Attempt(job_id=job, number=1, fencing_token=1, placement=[{"host": "h1", "slots": 1}]))
            db.commit()
        engine.dispose()
        log = Path(live.kiln.home) / "storage" / "logs" / str(job) / "1.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"before\n{NASTY}\nafter\n")
        assert api.post(f"/v1/jobs/{job}/cancel", json={"reason": NASTY}).status_code == 202
    return job


@pytest.mark.parametrize("command", ["events", "describe", "logs"])
def test_server_text_is_shown_not_obeyed(live: Live, nasty_job: int, command: str) -> None:
    code, out = in_terminal(live, command, str(nasty_job))
    assert code == 0, out.decode(errors="replace")
    for sequence in FORBIDDEN:
        assert sequence not in out, (sequence, out)
    shown = out.decode(errors="replace")
    if command != "logs":  # the reason, in the events table
        assert "[link=https://evil.example]click me[/link] [/bogus]" in shown
    assert "\\x1b[2J" in shown  # visible for what it is
