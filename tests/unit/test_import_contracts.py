"""The arrows of the architecture, as import-linter contracts in ``pyproject.toml`` (``lint-imports`` runs them in
``make test``; here they run over the same import graph, lazy imports in function bodies included):

- layers: ``cli`` and ``api`` on top (neither imports the other), ``scheduler`` and ``workers`` below them (apart
  from each other), ``core`` at the bottom; nothing imports ``api`` or ``cli``;
- the API calls ``core``; its factory (``api/app.py``) alone hands ``scheduler.live.forecast`` to the why service,
  and the scheduler's entry point (``scheduler/__main__.py``) alone hands the broker's
  ``workers.dispatch.dispatch_attempt`` to its loop;
- the CLI talks to the API: only its server-side commands (``cli.server``: ``up``, ``down``, ``admin bootstrap``,
  ``migrate``, ``simulate``) reach the database, the scheduler's replay and ``workers.inventory``;
- the control plane (``api``, ``cli``, ``core``, ``scheduler``, ``workers``) never imports ``trainer`` or torch;
- rank-side code (``rank``: what the worker launches in each rank) imports core's protocol only, never the trainer,
  the worker or the database; the trainer imports no control-plane package and no database;
- the pure policy (``scheduler.policy``) reads no database.

Each contract is shown to catch the wrong arrow it is there for (an import added to the real graph). What
import-linter cannot see is checked here with ``ast``: a router builds no query (import-linter sees SQLAlchemy as
one module, and a router may use its ``Session`` type), and no import cycle between the modules of a package.
"""

from __future__ import annotations

import ast
import copy
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter.configuration import configure
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "core", "scheduler", "workers", "cli", "trainer", "rank")
QUERY_BUILDERS = ("sqlalchemy", "sqlalchemy.select", "sqlalchemy.sql.select", "sqlalchemy.future.select")
CONTRACT_TYPES: dict[str, type[Contract]] = {
    "layers": LayersContract,
    "forbidden": ForbiddenContract,
    "independence": IndependenceContract,
    "acyclic_siblings": AcyclicSiblingsContract,
}


configure()  # import-linter's own settings (its timer, file system), as lint-imports sets them


def _config() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    session = _config()
    return grimp.build_graph(
        *session["root_packages"],
        include_external_packages=session["include_external_packages"],
        exclude_type_checking_imports=session["exclude_type_checking_imports"],
        cache_dir=None,
    )


def broken_contracts(graph: grimp.ImportGraph) -> list[str]:
    """The ids of the contracts in ``pyproject.toml`` that ``graph`` breaks."""
    session = {k: v for k, v in _config().items() if k != "contracts"}
    broken = []
    for options in _config()["contracts"]:
        contract = CONTRACT_TYPES[options["type"]](
            name=options["name"], session_options=session, contract_options=options
        )
        if not contract.check(copy.deepcopy(graph), verbose=False).kept:
            broken.append(options["id"])
    return broken


def test_the_arrows_point_down(graph: grimp.ImportGraph) -> None:
    assert broken_contracts(graph) == []


@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        ("core.spec", "api.app", "nothing-imports-api-or-cli"),
        ("trainer.loop", "cli.main", "nothing-imports-api-or-cli"),
        ("api.app", "cli.main", "layers"),
        ("workers.tasks", "scheduler.live.reconciler", "layers"),
        ("scheduler.live.loop", "workers.dispatch", "layers"),
        ("core.settings", "workers.tasks", "layers"),
        ("api.routers.jobs", "scheduler.live.loader", "api-composition-root"),
        ("api.routers.jobs", "workers.inventory", "api-composition-root"),
        ("api.deps", "torch", "no-trainer-in-control-plane"),
        ("cli.output", "trainer.recipes.gpt", "no-trainer-in-control-plane"),
        ("workers.supervisor", "trainer.loop", "no-trainer-in-control-plane"),
        # the review's breaks: the script rank read the trainer's telemetry, the CLI parsed a sweep with a database
        # service and listed GPUs and replayed traces outside its server-side commands
        ("rank.script", "trainer.telemetry", "rank-side"),
        ("rank.entry", "workers.tasks", "rank-side"),
        ("cli.commands.reuse", "core.sweeps.service", "cli-server-side"),
        ("cli.commands.jobs", "workers.inventory", "cli-server-side"),
        ("cli.app", "scheduler.simulate.replay", "cli-server-side"),
        ("cli.commands.jobs", "sqlalchemy", "cli-server-side"),
        ("trainer.loop", "workers.tasks", "trainer-apart"),
        ("trainer.compile", "core.db", "trainer-apart"),
        ("scheduler.policy.plan", "sqlalchemy", "pure-policy"),
        ("scheduler.policy.plan", "scheduler.live.loader", "pure-policy"),
    ],
)
def test_a_wrong_arrow_is_found(graph: grimp.ImportGraph, importer: str, imported: str, contract: str) -> None:
    wrong = copy.deepcopy(graph)
    wrong.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    assert contract in broken_contracts(wrong)


def test_the_entry_points_and_the_server_side_commands_are_the_named_exceptions(graph: grimp.ImportGraph) -> None:
    """The exceptions the contracts name are real imports (an exception nothing uses would hide nothing)."""
    assert graph.direct_import_exists(importer="scheduler.__main__", imported="workers.dispatch")
    assert graph.direct_import_exists(importer="api.app", imported="scheduler.live.forecast")
    assert graph.direct_import_exists(importer="cli.server.up", imported="workers.inventory")
    assert graph.direct_import_exists(importer="cli.server.commands", imported="scheduler.simulate.replay")


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


def router_queries(root: Path) -> list[str]:
    """A router that imports a query builder (``select``, or SQLAlchemy whole) or calls a ``select(...)``."""
    found = [
        f"a router must leave queries to core's repositories: {imp.module}:{imp.line} imports {imp.target}"
        for imp in imports_of(root, ("api",))
        if _within(imp.module, "api.routers") and imp.target in QUERY_BUILDERS
    ]
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


def test_a_router_builds_no_query() -> None:
    assert router_queries(ROOT) == []


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
    "files",
    [
        {"api/routers/q.py": "from sqlalchemy import func, select\n"},
        {"api/routers/d/q.py": "import sqlalchemy as sa\n"},
        {"api/routers/q.py": "def f(m):\n    return m.select(1)\n"},
    ],
)
def test_a_query_in_a_router_is_found(tmp_path: Path, files: dict[str, str]) -> None:
    found = router_queries(_tree(tmp_path, files))
    assert len(found) == 1 and "a router must leave queries to core's" in found[0], found


def test_a_router_may_use_a_session_type(tmp_path: Path) -> None:
    assert router_queries(_tree(tmp_path, {"api/routers/s.py": "from sqlalchemy.orm import Session\n"})) == []


def test_a_cycle_is_found_even_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "scheduler/loader.py": "from scheduler.snapshot import Snapshot\n",
            "scheduler/snapshot.py": "class Snapshot: ...\ndef load():\n    from scheduler.loader import x\n",
            "scheduler/policy.py": "from scheduler import snapshot\n",
        },
    )
    assert cycles(root) == [["scheduler.loader", "scheduler.snapshot"]]
