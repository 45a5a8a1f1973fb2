"""Server-Sent Events over an attempt's log file: send what is there, then (``follow``) tail it until the job
is terminal. The file is written by the worker under ``<storage>/logs/<job>/<attempt>.log``.

Each line is an ``event: log`` whose id is ``<attempt>:<byte offset after the line>``; a stream opened with that
id as ``Last-Event-ID`` (or ``last_event_id``) goes on with the next line of that attempt (api/sse.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api import sse
from api.deps import SessionFactory
from core.repositories import jobs as jobs_repo
from core.services.jobs import LogTarget
from core.states import TERMINAL, JobState

POLL_S = 0.5
CHUNK = 64 * 1024
MAX_ATTEMPT = 2**31 - 1
MAX_OFFSET = 2**53


def parse_position(value: str | None) -> tuple[int, int] | None:
    """``"<attempt>:<offset>"`` from a log event's id; None for anything else (the stream starts afresh)."""
    attempt, sep, offset = (value or "").partition(":")
    if not (sep and attempt.isdigit() and offset.isdigit() and len(attempt) <= 10 and len(offset) <= 16):
        return None
    a, o = int(attempt), int(offset)
    return (a, o) if 1 <= a <= MAX_ATTEMPT and o <= MAX_OFFSET else None


def tail_offset(path: Path | None, lines: int, *, block: int = 64 * 1024) -> int:
    """Where the last ``lines`` lines of the file begin (0 for a shorter file), reading back from the end a block
    at a time, never the whole file."""
    if path is None:
        return 0
    try:
        with path.open("rb") as f:
            end = pos = f.seek(0, 2)
            if lines <= 0:
                return end
            count = 0
            while pos > 0:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                chunk = f.read(step)
                i = len(chunk)
                while (i := chunk.rfind(b"\n", 0, i)) >= 0:
                    if pos + i != end - 1:  # the newline that ends the last line starts nothing
                        count += 1
                        if count == lines:
                            return pos + i + 1
            return 0
    except FileNotFoundError:
        return 0


def _read_from(path: Path | None, offset: int) -> bytes:
    if path is None:
        return b""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(CHUNK)
    except FileNotFoundError:
        return b""


def _probe(sessions: SessionFactory, job_id: int) -> tuple[str | None, int | None]:
    """(state, latest attempt number) in a short session of its own."""
    with sessions() as db:
        job = jobs_repo.get(db, job_id)
        return (None if job is None else job.state), jobs_repo.latest_attempt_number(db, job_id)


def log_path(storage_dir: Path, job_id: int, attempt: int) -> Path:
    return storage_dir / "logs" / str(job_id) / f"{attempt}.log"


async def sse_log_stream(
    *,
    request: Request,
    target: LogTarget,
    follow: bool,
    sessions: SessionFactory,
    storage_dir: Path,
    pinned: bool,
    guard: sse.Guard,
    resume: tuple[int, int] | None = None,
) -> AsyncIterator[str]:
    """``pinned``: the caller chose the attempt; otherwise a restart switches the stream to the new attempt.
    ``resume``: (attempt, offset) to go on from, as a previous stream's last event id said."""
    attempt, path, offset, pending = target.attempt, target.path, 0, b""
    if resume is not None and (pinned is False or resume[0] == attempt):
        attempt, offset = resume
        path = log_path(storage_dir, target.job_id, attempt)
    state: str | None = target.state
    last_sent = time.monotonic()
    while True:
        while True:  # drain what the file has now
            chunk = await run_in_threadpool(_read_from, path, offset)
            if not chunk:
                break
            position = offset - len(pending)  # where ``pending`` starts in the file
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                position += len(line) + 1  # each line's id: the offset right after it
                text = line.decode("utf-8", "replace").rstrip("\r")
                yield sse.event("log", text, f"{attempt}:{position}")
            last_sent = time.monotonic()
        if not follow or await request.is_disconnected():
            break
        if not await guard.allowed():
            yield sse.UNAUTHORIZED
            return
        state, latest = await run_in_threadpool(_probe, sessions, target.job_id)
        if state is None or JobState(state) in TERMINAL:
            if await run_in_threadpool(_read_from, path, offset):
                continue  # the last lines landed after our read: one more pass
            break
        if not pinned and latest is not None and (attempt is None or latest > attempt):
            if pending:
                yield sse.event("log", pending.decode("utf-8", "replace"), f"{attempt}:{offset}")
            attempt, offset, pending = latest, 0, b""
            path = log_path(storage_dir, target.job_id, attempt)
            yield sse.event("attempt", json.dumps({"attempt": attempt}), f"{attempt}:0")
            continue
        if time.monotonic() - last_sent >= sse.keepalive_s(request):
            yield sse.KEEPALIVE
            last_sent = time.monotonic()
        await asyncio.sleep(POLL_S)
    if pending:
        yield sse.event("log", pending.decode("utf-8", "replace"), f"{attempt}:{offset}")
    yield sse.event("end", json.dumps({"attempt": attempt, "state": state}))
