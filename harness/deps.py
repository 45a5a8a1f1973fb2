"""What a test needs from this machine. Outside CI a missing dependency skips the test; in CI (``CI`` set) it
fails it, so a green CI run never hides a test that did not run."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    """Skip (a developer's machine) or fail (CI) for a dependency this machine lacks."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must provide it)", pytrace=False)
    pytest.skip(what)


def require_module(name: str) -> ModuleType:
    """``name`` imported; for module-level use in a test module (``torch = require_module("torch")``)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"could not import {name!r}: {exc}")
