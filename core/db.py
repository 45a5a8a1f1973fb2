"""Engine, sessions and the declarative base with a constraint naming convention."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, ColumnElement, DateTime, Engine, MetaData, SQLColumnExpression, create_engine, event, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from core.private import create_private_file
from core.settings import Settings, get_settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC everywhere, SQLite included (which forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; kiln stores UTC-aware times only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(t: datetime | None) -> datetime | None:
    """A time from a request: one without a zone is UTC (RFC 3339 filters, ``?submitted_after=``)."""
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


def seconds_between(
    db: Session, later: SQLColumnExpression[Any], earlier: SQLColumnExpression[Any]
) -> ColumnElement[Any]:
    """``later - earlier`` in seconds, in SQL, on PostgreSQL and SQLite alike."""
    if db.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", later - earlier)
    return (func.julianday(later) - func.julianday(earlier)) * 86400.0


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, list[Any]: JSONType}


def idle_timeout_s(settings: Settings) -> float:
    """How long PostgreSQL lets a session of a process with these settings sit idle inside a transaction: the
    settings' ``idle_in_transaction_timeout_s``, else half the attempts' lease."""
    return settings.idle_in_transaction_timeout_s or settings.lease_s / 2


def make_engine(
    url: str, *, settings: Settings | None = None, idle_in_transaction_s: float | None = None, **kwargs: Any
) -> Engine:
    """``idle_in_transaction_s``: PostgreSQL ends this engine's sessions left idle in a transaction this long;
    default: what the process's ``settings`` give (``idle_timeout_s``); given neither (a one-off command, a
    test), the server's own setting."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)
        path = engine.url.database
        if path and path != ":memory:" and not path.startswith("file:"):
            # The database holds token hashes and every team's jobs: owner-only from its first byte (SQLite gives
            # its -wal and -shm files the same mode).
            create_private_file(Path(path))

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # API, scheduler and worker share the file
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    # A session frozen inside a transaction (its process SIGSTOPped, its VM paused) holds its row locks until the
    # server ends it: the reconciler, which locks every host row and the jobs it ends, would wait for it with the
    # whole scheduler, and the frozen attempt's lease would never be declared expired (the chaos bench found it).
    idle_s = idle_in_transaction_s or (idle_timeout_s(settings) if settings is not None else None)
    connect_args = dict(kwargs.pop("connect_args", {}))
    options = connect_args.get("options", "")
    if idle_s is not None and "idle_in_transaction_session_timeout" not in options:  # a caller's own value stands
        connect_args["options"] = f"{options} -c idle_in_transaction_session_timeout={int(idle_s * 1000)}".strip()
    kwargs["connect_args"] = connect_args
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", 20)
        kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("pool_pre_ping", True)  # a restarted PostgreSQL costs one failed request, not a pool
    return create_engine(url, **kwargs)


@lru_cache
def get_engine() -> Engine:
    """The process's engine, on the process's settings."""
    settings = get_settings()
    return make_engine(settings.resolved_database_url, settings=settings)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """For loops and tasks: the unit of work that opened the session commits (services never do)."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
