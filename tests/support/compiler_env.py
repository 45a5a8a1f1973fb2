"""The in-process trainer (``trainer.run.run``) points Inductor's and Triton's caches at its job's compile dir
through ``os.environ`` (``persist_compiler_caches``). A unit test that runs it must not leave that behind: the
workers a later test starts inherit the environment, and an attempt of a team's user could not reach a cache dir
under root's pytest directory (it crashed every attempt of the hostile-code tests once they ran after the unit
tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from core.trainer_protocol import COMPILER_CACHE_ENV


@pytest.fixture(autouse=True)
def compiler_cache_env_restored() -> Iterator[None]:
    before = {key: os.environ.get(key) for key in COMPILER_CACHE_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
