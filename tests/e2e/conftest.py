"""Fixtures that more than one e2e file uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_kiln_up import Up, start_up, stop_up


@pytest.fixture
def kiln_up(tmp_path: Path) -> Iterator[Up]:
    """``kiln up`` running from ``tmp_path`` (:func:`start_up`), stopped afterwards unless the test stopped it."""
    up = start_up(tmp_path)
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            stop_up(up)
