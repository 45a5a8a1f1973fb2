"""The house's size rules, held (issue 43): no function over 80 lines, no module over 500, in production code.

Migrations are left out: each is a frozen record of the schema's history, never edited once released (the initial
schema's ``upgrade`` is one long list of tables).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "cli", "core", "rank", "scheduler", "trainer", "workers")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("rule", ["functions", "modules"])
def test_production_code_keeps_the_size_rules(rule: str) -> None:
    over: list[str] = []
    for path in _modules():
        source = path.read_text()
        name = path.relative_to(ROOT)
        if rule == "modules" and len(source.splitlines()) > MAX_MODULE_LINES:
            over.append(f"{name}: {len(source.splitlines())} lines")
        if rule == "functions":
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        over.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    limit = MAX_FUNCTION_LINES if rule == "functions" else MAX_MODULE_LINES
    assert not over, f"over {limit} lines: split into named steps (docs/architecture.md)\n" + "\n".join(over)
