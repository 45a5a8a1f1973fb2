"""Request-scoped dependencies: the session (the request commits; services never do) and the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth import principal_for
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


# scope="function": the commit runs before the response goes out, so a 201 means the row is durable.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]


def get_principal(request: Request, db: SessionDep) -> Principal:
    return principal_for(request, db)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def get_stream_principal(request: Request, db: SessionDep) -> Principal:
    """For SSE endpoints: the token may also come as ``?access_token=`` (EventSource cannot send headers)."""
    return principal_for(request, db, allow_query_token=True)


StreamPrincipal = Annotated[Principal, Depends(get_stream_principal)]


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


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
