"""Print the requirements pyproject.toml declares, with the given extras, one per line.

Usage: python scripts/pyproject_deps.py [EXTRA ...] > requirements.txt

The Dockerfile installs these in a layer of their own, from pyproject.toml alone, before it copies kiln's source
and installs it with ``pip install --no-deps .``: a change to the code then rebuilds only that last layer and never
reinstalls torch and the CUDA libraries. Standard library only (it runs before anything is installed).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"pyproject_deps: no extra {', '.join(unknown)} in {pyproject} (has: {', '.join(optional)})")
    return list(project.get("dependencies", [])) + [r for e in extras for r in optional[e]]


def main(argv: list[str]) -> int:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(requirements(pyproject, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
