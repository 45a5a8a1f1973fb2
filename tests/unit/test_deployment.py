"""A storage directory belongs to one kiln database (core.deployment)."""

from __future__ import annotations

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
