"""Which scheduler leads: the holder (``host:pid:random``) of the unexpired ``scheduler_lease`` row."""

from __future__ import annotations

import psycopg

from scheduler.live.leader import psycopg_conninfo


def leader_holder(url: str) -> str | None:
    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        try:
            row = conn.execute(
                "SELECT holder FROM scheduler_lease WHERE id = 1 AND expires_at > clock_timestamp()"
            ).fetchone()
        except psycopg.errors.UndefinedTable:  # not migrated yet
            return None
    return str(row[0]) if row else None


def leader_pid(url: str) -> int | None:
    holder = leader_holder(url)
    return int(holder.split(":")[1]) if holder else None


def leader_term(url: str) -> int | None:
    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        row = conn.execute("SELECT term FROM scheduler_lease WHERE id = 1").fetchone()
    return int(str(row[0])) if row else None
