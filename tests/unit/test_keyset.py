"""Keyset pages in SQL (core/repositories/keyset.py): walked a page at a time, they are the whole ordered table."""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select

from core.repositories.keyset import Window, page

ROWS = [(p, n) for p, n in itertools.product((3, 1, 2), ("b", "a", "c"))]


def walk(order: list[tuple[Any, bool]], key: Any, size: int) -> list[tuple[int, str]]:
    engine = create_engine("sqlite://")
    meta = MetaData()
    t = Table("t", meta, Column("id", Integer, primary_key=True), Column("p", Integer), Column("n", String))
    meta.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(t), [{"p": p, "n": n} for p, n in ROWS])
        cols = {"p": t.c.p, "n": t.c.n}
        spec = [(cols[name], desc) for name, desc in order]
        seen: list[tuple[int, str]] = []
        after = None
        for _ in range(100):
            rows = [(r.p, r.n) for r in conn.execute(page(select(t.c.p, t.c.n), spec, Window(after, size + 1)))]
            seen += rows[:size]
            if len(rows) <= size:
                return seen
            after = key(rows[size - 1])
    raise AssertionError("no last page")


def test_pages_in_ascending_order_are_the_whole_table() -> None:
    for size in (1, 2, 4, 9):
        assert walk([("p", False), ("n", False)], lambda r: (r[0], r[1]), size) == sorted(ROWS)


def test_a_descending_column_pages_by_its_negated_key() -> None:
    # QoS classes' order: highest priority first, then by name; the cursor holds (-priority, name)
    expected = sorted(ROWS, key=lambda r: (-r[0], r[1]))
    for size in (1, 2, 4, 9):
        assert walk([("p", True), ("n", False)], lambda r: (-r[0], r[1]), size) == expected
