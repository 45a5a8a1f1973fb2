"""A storage directory belongs to one kiln database (core.deployment)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from core.deployment import MARKER, StorageOfAnotherDeployment, claim_storage


def test_a_storage_directory_is_claimed_by_the_first_database_and_refused_to_another(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    claim_storage(storage, "a" * 32)
    claim_storage(storage, "a" * 32)  # the same database again: every process of it checks at its start
    assert (storage / MARKER).read_text() == "a" * 32 + "\n"
    with pytest.raises(StorageOfAnotherDeployment) as refused:
        claim_storage(storage, "b" * 32)
    message = str(refused.value)
    assert "a" * 32 in message and "b" * 32 in message and "KILN_STORAGE_DIR" in message
    assert [p.name for p in storage.iterdir()] == [MARKER]  # no temporary file left behind


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
