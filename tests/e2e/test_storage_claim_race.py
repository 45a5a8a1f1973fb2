"""Processes of several kiln databases starting at once on a new storage directory: exactly one of them claims it
(core.deployment; the claim's rules in one process: tests/unit/test_deployment.py)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from core.deployment import MARKER, StorageOfAnotherDeployment, claim_storage

pytestmark = pytest.mark.e2e


def _claim(storage: str, uid: str) -> bool:
    try:
        claim_storage(Path(storage), uid)
    except StorageOfAnotherDeployment:
        return False
    return True


def test_processes_of_two_databases_starting_at_once_on_a_new_directory_agree_on_one(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    uids = [f"{i:032x}" for i in range(8)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        won = pool.starmap(_claim, [(str(storage), uid) for uid in uids])
    assert sum(won) == 1
    assert (storage / MARKER).read_text().strip() == uids[won.index(True)]
