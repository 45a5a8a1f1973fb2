"""The checkpoint staging buffers allocated beside the training (trainer/checkpoint/raw.py): a save that comes
before the allocation is done waits for it and stages the state it was given."""

from __future__ import annotations

import threading

import torch

from trainer.checkpoint.raw import _FlatStager


def test_a_stage_during_a_background_allocation_waits_for_it_and_copies_the_state() -> None:
    stager = _FlatStager(torch.device("cpu"), files=2)
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(7, dtype=torch.bfloat16)}
    leaves = [state["w"], state["b"]]
    gate, done = threading.Event(), threading.Event()
    real = stager._allocate

    def slow_allocate(*args: object) -> None:
        gate.wait(5)  # the allocation is still running when the save comes
        real(*args)  # type: ignore[arg-type]
        done.set()

    stager._allocate = slow_allocate  # type: ignore[method-assign]
    stager.layout(leaves, background=True)
    assert not done.is_set() and stager.signature is None
    threading.Timer(0.2, gate.set).start()
    tree = stager.stage(state)  # waits for the allocation, then copies
    assert done.is_set() and stager.alloc_s > 0
    staged = {e["shape"][0]: v for e, v in zip(stager.entries, stager.views, strict=True)}
    assert torch.equal(staged[300_000], state["w"]) and torch.equal(staged[7], state["b"])
    assert tree is not None
