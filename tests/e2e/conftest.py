"""Fixtures that more than one e2e file uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_kiln_up import Up, up_running


@pytest.fixture
def kiln_up(tmp_path: Path) -> Iterator[Up]:
    """``kiln up`` running from ``tmp_path`` (:func:`up_running`)."""
    with up_running(tmp_path) as up:
        yield up
