"""Write scikit-learn's handwritten digits as a directory of .npz shards: the data a team registers as a dataset.

    python examples/digits-npz/make_dataset.py ~/.local/share/kiln/storage/datasets/default/digits-npz

Writes ``train-0.npz`` .. ``train-3.npz`` and ``heldout.npz`` (arrays ``x``: N x 8 x 8 float32 in [0, 1], ``y``:
N int64), a fixed 80/20 split. Nothing is downloaded: the images ship inside scikit-learn's wheel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SHARDS = 4
HELD_OUT = 0.2


def write(directory: Path) -> list[Path]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(1234).permutation(len(y))
    cut = int(len(y) * (1 - HELD_OUT))
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, part in enumerate(np.array_split(order[:cut], SHARDS)):
        path = directory / f"train-{i}.npz"
        np.savez(path, x=x[part], y=y[part])
        written.append(path)
    np.savez(directory / "heldout.npz", x=x[order[cut:]], y=y[order[cut:]])
    return [*written, directory / "heldout.npz"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for path in write(Path(sys.argv[1])):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
