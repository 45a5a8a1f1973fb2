"""Request-scoped dependencies: the session (the request commits; services never do) and the caller."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth import principal_for
from core.deployment import check_storage
from core.services.principal import Principal
from core.settings import Settings


async def get_db(request: Request) -> AsyncIterator[Session]:
    """One session per request, committed after the handler returns and before the response is sent.

    Async so that it costs no thread hop of its own: making the session does no I/O, and the commit (or rollback)
    goes to the thread pool only when the handler left a transaction open -- handlers on the hot paths commit in
    their own thread (``finish``). Closing a session whose transaction has ended does no I/O either."""
    session: Session = request.app.state.sessionmaker()
    try:
        yield session
        if session.in_transaction():
            await run_in_threadpool(session.commit)
    except BaseException:
        if session.in_transaction():
            await run_in_threadpool(session.rollback)
        raise
    finally:
        if session.in_transaction():  # pragma: no cover - both branches above end it
            await run_in_threadpool(session.close)
        else:
            session.close()


def finish(db: Session) -> None:
    """Commit the request's unit of work in the handler's own thread (``get_db`` then has nothing left to do).
    Only request handlers call this; services never commit."""
    db.commit()


P = ParamSpec("P")
T = TypeVar("T")

# The hot paths' threads (submit, list): a pool of their own, as many as the engine's pool keeps connections (16
# per worker, api.app.make_api_engine), so a hot request never waits for an overflow connection, and neither
# waits behind nor starves the shared pool's other work (admin endpoints, SSE set-up). The hop through
# ``loop.run_in_executor`` costs about 15 us of CPU with 32 requests in flight, against about 60 us through
# anyio's ``to_thread`` (run_in_threadpool). Requests beyond 16 per worker queue on the event loop.
HOT_THREADS = 16
_hot_pool = ThreadPoolExecutor(max_workers=HOT_THREADS, thread_name_prefix="kiln-hot")


async def run_hot(func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``run_in_threadpool`` on the hot paths' own small pool (the context variables travel along)."""
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, func, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_hot_pool, call)


def autocommit(db: Session) -> None:
    """Run the request's statements in autocommit on PostgreSQL: no ``BEGIN`` and ``COMMIT`` round trips (psycopg
    sends each as a command of its own), 3 round trips per submission instead of 5 and 2 per list instead of 4.
    Only for handlers whose writes are each one statement (atomic on its own) and whose reads need no common
    snapshot -- under READ COMMITTED each statement takes its own snapshot anyway: submit (its write is one
    statement, ``jobs_repo.insert_submitted``) and list. The pool puts the connection back in transaction mode
    when it is returned. A no-op on SQLite and for a session bound to a connection (the tests' rolled-back one)."""
    bind = db.get_bind()
    if isinstance(bind, Engine) and bind.dialect.name == "postgresql" and not db.in_transaction():
        db.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


# scope="function": the commit runs before the response goes out, so a 201 means the row is durable.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]


def get_principal(request: Request, db: SessionDep) -> Principal:
    return principal_for(request, db)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def get_stream_principal(request: Request, db: SessionDep) -> Principal:
    """For SSE endpoints: the header, or a stream ticket for this path as ``?ticket=`` (EventSource cannot send
    headers; a token itself is never taken from a URL)."""
    return principal_for(request, db, stream=True)


StreamPrincipal = Annotated[Principal, Depends(get_stream_principal)]


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_storage_dir(request: Request, db: SessionDep) -> Path:
    """The storage directory, once it is known to be this database's (``core.deployment``): checked when the API
    starts, or, when the database was down then, by the first request that reads or writes the directory.
    Raises ``StorageOfAnotherDeployment`` (503) while another database owns it."""
    storage: Path = request.app.state.settings.resolved_storage_dir
    if not request.app.state.storage_checked:
        check_storage(db, storage)
        request.app.state.storage_checked = True
    return storage


StorageDirDep = Annotated[Path, Depends(get_storage_dir)]


SessionFactory = Callable[[], AbstractContextManager[Session]]


def get_session_factory(request: Request) -> SessionFactory:
    """Short read-only sessions for work that outlives the request's own (SSE streams polling the job)."""
    maker = request.app.state.sessionmaker

    @contextmanager
    def read_session() -> Iterator[Session]:
        session: Session = maker()
        try:
            yield session
        finally:
            session.rollback()
            session.close()

    return read_session


SessionFactoryDep = Annotated[SessionFactory, Depends(get_session_factory)]
