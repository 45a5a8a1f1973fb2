"""The arrows of the architecture, checked over the import graph (every ``import`` statement, lazy ones in function
bodies included, read with ``ast``):

- ``core`` imports no other kiln package: it is below everything;
- ``api``, ``workers`` and ``scheduler`` do not import each other: they call ``core``. The exceptions are entry
  points: the scheduler's (``scheduler/__main__.py``) hands the broker's ``workers.dispatch.dispatch_attempt`` to
  the loop as a callable, and the API's factory (``api/app.py``) hands ``scheduler.live.forecast`` to the why
  service;
- the control plane (``api``, ``core``, ``scheduler``, ``cli``) never imports ``trainer`` or torch;
- the pure policy (``scheduler.policy``) reads no database: it imports neither SQLAlchemy nor ``scheduler.live``;
- the API's routers build no queries: they parse input, call a service and shape output, so no module under
  ``api.routers`` imports SQLAlchemy's ``select`` (nor SQLAlchemy whole) or calls a ``select(...)``;
- no import cycle inside a package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "core", "scheduler", "workers", "cli", "trainer")
CONTROL_PLANE = ("api", "core", "scheduler", "cli")
# A process's entry point may wire a lower layer's callable in: the scheduler hands the broker's dispatch to its loop;
# the API's factory hands the scheduler's start projection (plan() run forward) to the why service.
COMPOSITION_ROOTS = {("scheduler.__main__", "workers.dispatch"), ("api.app", "scheduler.live.forecast")}
QUERY_BUILDERS = ("sqlalchemy", "sqlalchemy.select", "sqlalchemy.sql.select", "sqlalchemy.future.select")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (or the name inside it, for ``from m import name``)
    line: int


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    found: list[Import] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = _module_name(path, root)
            is_package = path.name == "__init__.py"
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    found += [Import(module, alias.name, node.lineno) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # relative: resolve against the importing module's package
                        anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                        base = ".".join([*anchor, base] if base else anchor)
                    found += [Import(module, f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _top(name: str) -> str:
    return name.split(".")[0]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: Path) -> list[str]:
    found: list[str] = []
    for imp in imports_of(root):
        where = f"{imp.module}:{imp.line} imports {imp.target}"
        source, target = _top(imp.module), _top(imp.target)
        if source == "core" and target in PACKAGES and target != "core":
            found.append(f"core must import no other kiln package: {where}")
        wired = any(imp.module == m and _within(imp.target, t) for m, t in COMPOSITION_ROOTS)
        if {source, target} == {"scheduler", "workers"} and not wired:
            found.append(f"scheduler and workers must not import each other: {where}")
        if {source, target} in ({"api", "scheduler"}, {"api", "workers"}) and not wired:
            found.append(f"api, scheduler and workers must not import each other: {where}")
        if source in CONTROL_PLANE and target in ("trainer", "torch"):
            found.append(f"the control plane must not import {target}: {where}")
        if _within(imp.module, "scheduler.policy") and (
            target == "sqlalchemy" or _within(imp.target, "scheduler.live") or _within(imp.target, "core.models")
        ):
            found.append(f"the pure policy must not read the database: {where}")
        if _within(imp.module, "api.routers") and imp.target in QUERY_BUILDERS:
            found.append(f"a router must leave queries to core's repositories: {where}")
    return found + queries_in_routers(root)


def queries_in_routers(root: Path) -> list[str]:
    """Calls of a ``select(...)`` (a bare name or an attribute) in a module under ``api/routers``."""
    found: list[str] = []
    for path in sorted((root / "api" / "routers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name == "select":
                    where = f"{_module_name(path, root)}:{node.lineno} calls select()"
                    found.append(f"a router must leave queries to core's repositories: {where}")
    return found


def _modules(root: Path) -> set[str]:
    return {_module_name(p, root) for package in PACKAGES for p in (root / package).rglob("*.py")}


def _resolve(target: str, modules: set[str]) -> str | None:
    """The module an import loads: ``from a.b import c`` is module ``a.b.c`` if that exists, else ``a.b``."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def cycles(root: Path) -> list[list[str]]:
    """Import cycles between modules of the same top-level package (Tarjan's strongly connected components)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports_of(root):
        target = _resolve(imp.target, modules)
        if target is not None and target != imp.module and _top(target) == _top(imp.module):
            graph[imp.module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursive: the deepest import chain is a few dozen modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_arrows_point_down() -> None:
    assert violations(ROOT) == []


def test_no_import_cycle_inside_a_package() -> None:
    assert cycles(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"core/a.py": "from api import app\n"}, "core must import no other kiln package"),
        ({"workers/t.py": "def f():\n    from scheduler.live import reconciler\n"}, "must not import each other"),
        ({"scheduler/live/loop.py": "from workers.dispatch import dispatch_attempt\n"}, "must not import each other"),
        ({"api/x.py": "import torch\n"}, "the control plane must not import torch"),
        ({"api/routers/w.py": "from scheduler.live import loader\n"}, "api, scheduler and workers must not import"),
        ({"cli/x.py": "from trainer.recipes import gpt\n"}, "the control plane must not import trainer"),
        ({"scheduler/policy/p.py": "from sqlalchemy import select\n"}, "the pure policy must not read the database"),
        ({"api/routers/q.py": "from sqlalchemy import func, select\n"}, "a router must leave queries to core's"),
        ({"api/routers/d/q.py": "import sqlalchemy as sa\n"}, "a router must leave queries to core's"),
        ({"api/routers/q.py": "def f(m):\n    return m.select(1)\n"}, "a router must leave queries to core's"),
    ],
)
def test_a_wrong_arrow_is_found(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    found = violations(_tree(tmp_path, files))
    assert len(found) == 1 and expected in found[0], found


def test_the_entry_point_may_wire_the_broker_in(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"scheduler/__main__.py": "from workers.dispatch import dispatch_attempt\n"})
    assert violations(root) == []


def test_a_cycle_is_found_even_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "scheduler/loader.py": "from scheduler.snapshot import Snapshot\n",
        "scheduler/snapshot.py": "class Snapshot: ...\ndef load():\n    from scheduler.loader import x\n",
        "scheduler/policy.py": "from scheduler import snapshot\n",
    })  # fmt: skip
    assert cycles(root) == [["scheduler.loader", "scheduler.snapshot"]]
