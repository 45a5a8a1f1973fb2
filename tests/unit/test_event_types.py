"""``core.event_types.EventType`` names every event type kiln writes. The trainer and rank packages may not import
core (pyproject.toml's import-linter contracts), so their events come as strings in the telemetry: each string they
emit is read from their source here and must be a member. Production code elsewhere writes and matches members, not
literals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.event_types import EventType
from core.states import JobState

ROOT = Path(__file__).resolve().parents[2]
TRAINER_SIDE = ("trainer", "rank")
EMITTERS = {"event": 0, "exit_with": 1}  # the call, and which positional argument is the event type


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def emitted(path: Path) -> set[str]:
    """The event types a module of the trainer side emits: the literal type of each ``tel.event(TYPE, ...)`` and
    ``exit_with(code, TYPE, ...)``, and the compile fallbacks' types (``FALLBACK_*``), which it passes on by name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EMITTERS:
            index = EMITTERS[node.func.attr]
            arg = node.args[index] if len(node.args) > index else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("FALLBACK_"):
            found.add(node.value)
    return found


def test_every_event_the_trainer_side_emits_is_a_member() -> None:
    by_module = {p.relative_to(ROOT).as_posix(): emitted(p) for p in _sources(*TRAINER_SIDE)}
    everything = set().union(*by_module.values())
    assert len(everything) >= 30, "the scan found too few events: has the telemetry call changed its name?"
    unknown = {m: sorted(t for t in types if t not in set(EventType)) for m, types in by_module.items()}
    assert {m: t for m, t in unknown.items() if t} == {}


def test_the_scan_sees_each_way_of_emitting(tmp_path: Path) -> None:
    tree = 'tel.event("A_EVENT", "m")\nc.exit_with(code, "B_EVENT", "m")\nreason = "FALLBACK_X"\nx.other("C", "m")\n'
    path = tmp_path / "probe.py"
    path.write_text(tree)
    assert emitted(path) == {"A_EVENT", "B_EVENT", "FALLBACK_X"}


def test_a_state_change_is_named_by_its_state() -> None:
    assert {s.value for s in JobState} <= set(EventType)


@pytest.mark.parametrize("package", ["api", "cli", "core", "scheduler", "workers"])
def test_production_code_writes_no_event_type_as_a_literal(package: str) -> None:
    """``record_event(db, "X", ...)`` and ``Event(type="X")`` are written with a member instead."""
    literal: list[str] = []
    for path in _sources(package):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = [*(node.args[1:2] if name == "record_event" else [])]
            args += [k.value for k in node.keywords if name == "Event" and k.arg == "type"]
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                literal.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert literal == []
