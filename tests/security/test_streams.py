"""Live streams against a real API process: no token in a URL (a stream ticket instead), keepalive comments,
``Last-Event-ID`` resume without a missed or repeated line, and the caller checked again while a stream is open.

Before: the SSE endpoints took ``?access_token=`` (the dashboard always used it, and an access log kept it), and
open streams were never checked again: a revoked token or a removed member kept receiving events."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from harness.dashboard import ROOT
from tests.security.live import Live

pytestmark = pytest.mark.e2e


def read_stream(
    url: str, *, headers: dict[str, str] | None = None, until: int = 3, max_comments: int = 2
) -> tuple[list[dict[str, str]], int]:
    """(the first ``until`` events: fields by name, the comment lines seen meanwhile); stops early after
    ``max_comments`` comments (an idle stream)."""
    events: list[dict[str, str]] = []
    comments, current = 0, {}
    with httpx.stream("GET", url, headers=headers or {}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith(":"):
                comments += 1
                if comments >= max_comments:
                    break
            elif not line:
                if current:
                    events.append(current)
                    current = {}
                if len(events) >= until:
                    break
            else:
                key, _, value = line.partition(": ")
                current[key] = value
    return events, comments


def test_tokens_are_never_taken_from_a_url_and_tickets_open_one_stream(live: Live) -> None:
    logs = f"/v1/jobs/{live.job}/logs"
    r = httpx.get(f"{live.kiln.url}{logs}", params={"access_token": live.kiln.token})
    assert r.status_code == 401 and "never accepted in a URL" in r.json()["detail"]
    ticket = live.ticket(logs)
    events, _ = read_stream(f"{live.kiln.url}{logs}?ticket={ticket}", until=1)
    assert events[0]["data"] == "line 1"
    for elsewhere in (f"/v1/dashboard/jobs/{live.job}/stream", "/v1/jobs", f"/v1/jobs/{live.job}"):
        assert httpx.get(f"{live.kiln.url}{elsewhere}", params={"ticket": ticket}).status_code == 401
    forged = ticket[:-4] + ("AAAA" if not ticket.endswith("AAAA") else "BBBB")
    assert httpx.get(f"{live.kiln.url}{logs}", params={"ticket": forged}).status_code == 401
    r = httpx.post(f"{live.kiln.url}/v1/stream-tickets", json={"path": "/v1/jobs"}, headers=live.headers())
    assert r.status_code == 422  # only stream paths


def test_keepalive_and_resume_miss_nothing(live: Live) -> None:
    url = f"{live.kiln.url}/v1/jobs/{live.job}/logs?follow=true"
    first, _ = read_stream(url, headers=live.headers(), until=3)
    assert [e["data"] for e in first] == ["line 1", "line 2", "line 3"]
    _, comments = read_stream(url, headers=live.headers(), until=4)  # the 4th event never comes: keepalives do
    assert comments >= 1
    with live.log.open("a") as f:  # the trainer writes on while the client is away
        f.write("line 4\nline 5\n")
    resumed, _ = read_stream(url, headers={**live.headers(), "Last-Event-ID": first[1]["id"]}, until=3)
    assert [e["data"] for e in resumed] == ["line 3", "line 4", "line 5"]
    # The browser's way: a new ticket and the last id as a query parameter.
    ticket = live.ticket(f"/v1/jobs/{live.job}/logs")
    resumed, _ = read_stream(f"{url}&ticket={ticket}&last_event_id={resumed[1]['id']}", until=1)
    assert [e["data"] for e in resumed] == ["line 5"]


def _follow_until_end(url: str, headers: dict[str, str], box: list[dict[str, str]]) -> None:
    current: dict[str, str] = {}
    with httpx.stream("GET", url, headers=headers, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if current.get("event") == "end":
                    box.append(current)
                    return
                current = {}
                continue
            key, _, value = line.partition(": ")
            current[key] = value


def _opened_then(live: Live, url: str, headers: dict[str, str], act: object) -> dict[str, str]:
    """Follow ``url`` in a thread, do ``act`` once it is open, and return the stream's ``end`` event."""
    box: list[dict[str, str]] = []
    reader = threading.Thread(target=_follow_until_end, args=(url, headers, box), daemon=True)
    reader.start()
    reader.join(timeout=2)  # it is open and idle (keepalives) by now
    assert reader.is_alive() and not box
    act()  # type: ignore[operator]
    reader.join(timeout=20)
    assert box, "the stream went on after the caller lost its right to it"
    return box[0]


def test_a_revoked_token_or_a_removed_member_stops_receiving(live: Live) -> None:
    token = live.user_token("mia")
    with live.kiln.api() as api:
        token_id = next(
            t["id"] for t in api.get("/v1/tokens", params={"user": "mia"}).json()["items"] if t["name"] == "mine"
        )
        end = _opened_then(
            live,
            f"{live.kiln.url}/v1/jobs/{live.job}/logs?follow=true",
            live.headers(token),
            lambda: api.delete(f"/v1/tokens/{token_id}"),
        )
    assert json.loads(end["data"]) == {"reason": "unauthorized"}

    token = live.user_token("noah")
    path = f"/v1/dashboard/jobs/{live.job}/stream"
    ticket = live.ticket(path, token)
    with live.kiln.api() as api:
        end = _opened_then(
            live, f"{live.kiln.url}{path}?ticket={ticket}", {}, lambda: api.delete("/v1/teams/default/members/noah")
        )
    assert json.loads(end["data"]) == {"reason": "unauthorized"}


class CuttingProxy:
    """A TCP relay in front of the API that breaks its first response after ``cut_after`` bytes of body: a
    connection lost mid-stream, for real, between the CLI and the API."""

    def __init__(self, upstream_port: int, cut_after: int):
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.connections = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            limit = self.cut_after if self.connections == 1 else None
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, limit), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        seen, body = b"", None
        try:
            while data := src.recv(4096):
                if limit is not None:
                    seen += data
                    if body is None and b"\r\n\r\n" in seen:
                        body = seen.index(b"\r\n\r\n") + 4
                    if body is not None and len(seen) - body > limit:
                        dst.sendall(data[: len(data) - (len(seen) - body - limit)])
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.server.close()


def test_the_cli_resumes_a_broken_log_stream(live: Live, tmp_path: Path) -> None:
    port = int(live.kiln.url.rsplit(":", 1)[1])
    proxy = CuttingProxy(port, cut_after=60)  # past the first line, inside the second
    try:
        env = {
            **os.environ,
            "KILN_API_URL": f"http://127.0.0.1:{proxy.port}",
            "KILN_TOKEN": live.kiln.token,
            "XDG_CONFIG_HOME": str(tmp_path),
        }
        out = subprocess.run(
            [sys.executable, "-m", "cli.main", "logs", str(live.job)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        proxy.close()
    assert out.returncode == 0, out.stderr
    assert proxy.connections >= 2  # it was cut, and the CLI came back
    assert out.stdout == live.log.read_text()  # every line once, in order
