"""Batches addressed by index, so a run's data position is one integer (plus the batches a guard skipped).

Batch ``i`` of a run is a pure function of (seed, i): a ``torch.Generator`` seeded from both picks the
windows of the *global* batch, and each rank takes its slice.  Resuming at cursor ``c`` therefore replays
exactly the batches an uninterrupted run would have seen, whatever happened to RNG state in between.
"""

from __future__ import annotations

import abc
import hashlib
import os
import pathlib
import sysconfig
import tempfile
from typing import Any

import torch

_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}


def stdlib_files() -> list[pathlib.Path]:
    """The standard library's .py files (tests and third-party packages excluded), in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not (_SKIP_DIRS & set(p.relative_to(root).parts))]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def build_stdlib_corpus(max_bytes: int, cache_dir: str | os.PathLike[str] | None = None) -> torch.Tensor:
    """A byte-level corpus (uint8) of the stdlib's own source, built offline and cached on disk.

    The cache is keyed by the file list and sizes, so a different Python gives a different corpus file
    instead of silently reusing a stale one.  Written atomically so concurrent ranks never read half a file.
    """
    files = stdlib_files()
    key = hashlib.sha256()
    for p in files:
        key.update(p.as_posix().encode())
        key.update(str(p.stat().st_size).encode())
    key.update(str(max_bytes).encode())
    cache = pathlib.Path(cache_dir or os.path.join(tempfile.gettempdir(), "kiln-corpus"))
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"stdlib-{key.hexdigest()[:16]}.bin"
    if not path.exists():
        chunks: list[bytes] = []
        total = 0
        for p in files:
            data = p.read_bytes() + b"\n"
            chunks.append(data)
            total += len(data)
            if total >= max_bytes:
                break
        blob = b"".join(chunks)[:max_bytes]
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=".corpus-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)


class IndexedBatches(abc.ABC):
    """A rank's view of batches addressed by index: the position (``cursor``, ``skip``) and its state.

    Subclasses say what batch ``index`` is; :meth:`generator` gives the (seed, index)-seeded RNG to draw it with.
    """

    def __init__(self, *, batch_size: int, rank: int, world_size: int, seed: int) -> None:
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.cursor = 0  # index of the next batch to draw
        self.skip: set[int] = set()  # batch indices a guard rolled back over

    def generator(self, index: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 1_000_003 + index) % (2**63))

    @abc.abstractmethod
    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def next(self) -> tuple[int, tuple[torch.Tensor, torch.Tensor]]:
        while self.cursor in self.skip:
            self.cursor += 1
        index = self.cursor
        self.cursor += 1
        return index, self.batch(index)

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "skip": sorted(self.skip)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.skip = {int(i) for i in state["skip"]}


class TokenBatches(IndexedBatches):
    """Language-model batches: inputs ``x`` and next-token targets ``y`` of shape (batch, seq_len).

    ``tokens`` None means synthetic uniform tokens over ``vocab_size`` (for benchmarks: no learning signal,
    but the same shapes and data path).
    """

    def __init__(
        self,
        *,
        tokens: torch.Tensor | None,
        vocab_size: int,
        batch_size: int,
        seq_len: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        if tokens is not None and tokens.numel() <= seq_len + 1:
            raise ValueError("corpus shorter than one sequence")
        super().__init__(batch_size=batch_size, rank=rank, world_size=world_size, seed=seed)
        self.tokens = tokens
        self.vocab_size = vocab_size
        self.seq_len = seq_len

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.generator(index)
        lo = self.rank * self.batch_size
        if self.tokens is None:
            full = torch.randint(
                0, self.vocab_size, (self.world_size * self.batch_size, self.seq_len + 1), generator=gen
            )
            seqs = full[lo : lo + self.batch_size]
        else:
            n = self.tokens.numel() - self.seq_len - 1
            starts = torch.randint(0, n, (self.world_size * self.batch_size,), generator=gen)[lo : lo + self.batch_size]
            idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
            seqs = self.tokens[idx].long()
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
