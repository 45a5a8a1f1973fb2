"""Server-Sent Events over an attempt's log file: send what is there, then (``follow``) tail it until the job
is terminal. The file is written by the worker under ``<storage>/logs/<job>/<attempt>.log``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.deps import SessionFactory
from core.repositories import jobs as jobs_repo
from core.services.jobs import LogTarget
from core.states import TERMINAL, JobState

POLL_S = 0.5
CHUNK = 64 * 1024


def _sse(event: str, data: str, id_: int | None = None) -> str:
    head = f"id: {id_}\n" if id_ is not None else ""
    body = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}event: {event}\n{body}\n"


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


async def sse_log_stream(
    *, request: Request, target: LogTarget, follow: bool, sessions: SessionFactory, storage_dir: Path, pinned: bool
) -> AsyncIterator[str]:
    """``pinned``: the caller chose the attempt; otherwise a restart switches the stream to the new attempt."""
    attempt, path, offset, pending = target.attempt, target.path, 0, b""
    state: str | None = target.state
    while True:
        while True:  # drain what the file has now
            chunk = await run_in_threadpool(_read_from, path, offset)
            if not chunk:
                break
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield _sse("log", line.decode("utf-8", "replace").rstrip("\r"), offset - len(pending))
        if not follow or await request.is_disconnected():
            break
        state, latest = await run_in_threadpool(_probe, sessions, target.job_id)
        if state is None or JobState(state) in TERMINAL:
            if await run_in_threadpool(_read_from, path, offset):
                continue  # the last lines landed after our read: one more pass
            break
        if not pinned and latest is not None and latest != attempt:
            if pending:
                yield _sse("log", pending.decode("utf-8", "replace"), offset)
            attempt, offset, pending = latest, 0, b""
            path = storage_dir / "logs" / str(target.job_id) / f"{attempt}.log"
            yield _sse("attempt", json.dumps({"attempt": attempt}))
            continue
        await asyncio.sleep(POLL_S)
    if pending:
        yield _sse("log", pending.decode("utf-8", "replace"), offset)
    yield _sse("end", json.dumps({"attempt": attempt, "state": state}))
