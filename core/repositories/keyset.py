"""Keyset pages in SQL, for the lists that grow with the deployment (hosts, GPUs, users, tokens, artifacts, sweeps,
webhook deliveries, a job's attempts and checkpoints): a page reads its own rows and no others.

A page starts strictly after the previous page's last key and holds at most ``Window.rows`` rows (the API asks for a
page and one more, to know whether a next one exists). Keys are those the API's cursors carry
(``api.routers.common``): one value per ordering column, a descending column's negated, so a cursor of the in-memory
``paged`` and one of this agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, and_, or_
from sqlalchemy.orm import QueryableAttribute

S = TypeVar("S", bound=Select[*tuple[Any, ...]])
Order = Sequence[tuple[ColumnElement[Any] | QueryableAttribute[Any], bool]]  # (column, descending)


@dataclass(frozen=True, slots=True)
class Window:
    after: tuple[Any, ...] | None  # the previous page's last key; None: from the start
    rows: int


def page(stmt: S, order: Order, window: Window | None) -> S:
    """``stmt`` ordered by ``order`` ((column, descending) pairs; the last must make the order total), from after
    ``window.after``, at most ``window.rows`` rows; every row when ``window`` is None."""
    stmt = stmt.order_by(*(column.desc() if descending else column for column, descending in order))
    if window is None:
        return stmt
    if window.after is not None:
        stmt = stmt.where(after(order, window.after))
    return stmt.limit(window.rows)


def after(order: Order, key: tuple[Any, ...]) -> ColumnElement[bool]:
    """Rows strictly after ``key``: the first column past its value, or equal and the next past its, and so on
    (spelled out rather than as a row value, as a descending column compares the other way)."""
    values = [-v if descending else v for (_c, descending), v in zip(order, key, strict=True)]
    terms = []
    for i, (column, descending) in enumerate(order):
        past = column < values[i] if descending else column > values[i]
        terms.append(and_(*(c == v for (c, _d), v in zip(order[:i], values[:i], strict=True)), past))
    return or_(*terms)
