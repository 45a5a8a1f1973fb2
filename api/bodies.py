"""Documents from request bodies, read within bounds: a body nested too deeply, or a YAML body of too many nodes, is
refused while it is read, before it costs the API more than a few milliseconds.

* **YAML** (job specs and sweeps): first libyaml's parser (C) runs over the events alone, counting depth and values
  and stopping at the first alias, so a ``[[[[...`` or a long flat list is refused at the bound, not at the end of
  the body (specs never need an alias, and aliases let a small document expand); a document within the bounds is
  then read by PyYAML's C safe loader. Where libyaml is missing, PyYAML's pure-Python loader is bounded the same
  way while it composes, and its scanner stops at the same depth (its cost per token grows with the depth of open
  flow collections).
* **JSON** (every body the API reads): ``json_depth`` measures the nesting from the bytes, outside strings, before
  anything parses them (``api.middleware.BodyLimitMiddleware``); the parsers then meet only shallow documents.

Refusals are ``DocumentError``: 422, with ``errors[0].type`` ``depth``, ``size``, ``alias`` or ``value``.
"""

from __future__ import annotations

import itertools
from array import array
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import Node
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from core.spec import SpecError, yaml_error

MAX_DEPTH = 32  # nested mappings and sequences; a job spec or a sweep needs fewer than 10
MAX_YAML_NODES = 10_000  # scalars, mappings and sequences of one YAML document (a sweep of 256 points: ~2,000)


class DocumentError(SpecError):
    """A document refused while it was read (a 422 like any spec error, ``api.errors``)."""

    def __init__(self, message: str, kind: str, line: int | None = None) -> None:
        where = f" (line {line + 1})" if line is not None else ""
        super().__init__(message, [{"loc": "$", "msg": message + where, "type": kind}])


def _too_deep(limit: int) -> DocumentError:
    return DocumentError(f"the document is nested more than {limit} levels deep", "depth")


class _BoundedComposer(Composer):
    """PyYAML's composer, counting as it goes: collections open now (depth) and nodes so far; no aliases."""

    max_depth = MAX_DEPTH
    max_nodes = MAX_YAML_NODES
    _depth = 0
    _nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, AliasEvent):
            raise DocumentError("YAML aliases are not accepted", "alias", _line(event))
        self._nodes += 1
        if self._nodes > self.max_nodes:
            raise DocumentError(f"the document has more than {self.max_nodes} values", "size", _line(event))
        if not isinstance(event, CollectionStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self.max_depth:
            raise _too_deep(self.max_depth)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _line(event: Any) -> int | None:
    mark = getattr(event, "start_mark", None)
    return getattr(mark, "line", None)


class _BoundedScanner(Scanner):
    """The pure-Python scanner, stopped at the depth bound (flow collections and block indentation)."""

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise _too_deep(MAX_DEPTH)
        super().fetch_flow_collection_start(token_class)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) > MAX_DEPTH:
            raise _too_deep(MAX_DEPTH)
        return super().add_indent(column)


_CParser: Any
try:  # libyaml, where PyYAML was built with it (its wheels are)
    from yaml._yaml import CParser as _CParser
except ImportError:  # pragma: no cover
    _CParser = None


class BoundedLoader(Reader, _BoundedScanner, Parser, _BoundedComposer, SafeConstructor, Resolver):
    """PyYAML's pure-Python safe loader, bounded while it scans and composes (where libyaml is missing)."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        _BoundedScanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


_OPEN = (MappingStartEvent, SequenceStartEvent)
_CLOSE = (MappingEndEvent, SequenceEndEvent)


def _check_events(text: str) -> None:
    """libyaml's events of ``text``, counted: ``DocumentError`` at the first alias, the first collection deeper than
    ``MAX_DEPTH``, or the value after ``MAX_YAML_NODES``; ``yaml.YAMLError`` for malformed YAML."""
    parser = _CParser(text)
    depth = nodes = 0
    try:
        while True:
            event = parser.get_event()
            kind = type(event)
            if kind is ScalarEvent:
                nodes += 1
            elif kind in _OPEN:
                nodes += 1
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(MAX_DEPTH)
            elif kind in _CLOSE:
                depth -= 1
            elif kind is AliasEvent:
                raise DocumentError("YAML aliases are not accepted", "alias", _line(event))
            elif event is None or kind is StreamEndEvent:
                return
            if nodes > MAX_YAML_NODES:
                raise DocumentError(f"the document has more than {MAX_YAML_NODES} values", "size", _line(event))
    finally:
        parser.dispose()


def load_yaml(text: str) -> Any:
    """One YAML document, as ``yaml.safe_load`` reads it, within ``MAX_DEPTH`` and ``MAX_YAML_NODES``, without
    aliases. Raises ``DocumentError`` past a bound, ``yaml.YAMLError`` for malformed YAML."""
    try:
        if _CParser is not None:
            _check_events(text)
            return yaml.load(text, Loader=yaml.CSafeLoader)  # noqa: S506 - the C build of the safe loader
        loader = BoundedLoader(text)  # pragma: no cover - PyYAML without libyaml
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        # libyaml looks ahead of the events within a line, and stops at 1,000 open collections itself
        if "maximum nesting depth" in str(exc.problem):
            raise _too_deep(MAX_DEPTH) from None
        raise
    except ValueError as exc:  # an integer of more digits than int() converts, a date out of range
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"a value cannot be read: {str(exc)[:200]}", "value") from None


def yaml_body(body: bytes) -> Any:
    """A request body's YAML document (``load_yaml``); ``SpecError`` for one that is not UTF-8 or not YAML, with
    the line and column."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("the body is not UTF-8", [{"loc": "$", "msg": str(exc), "type": "encoding"}]) from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, text) from None


# JSON: what is left of a body once strings are out is its brackets; each opening one is a step down.
_ESCAPED_BACKSLASH, _ESCAPED_QUOTE = b"\\\\", b'\\"'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_depth(body: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep the JSON text ``body`` nests (0 for a scalar), measured outside its strings; any number at most
    ``limit`` when it cannot be deeper than that (it has no more opening brackets, a body's usual case, answered
    by two counts). Exact for valid JSON, in a few passes of C over the bytes (about 10 ms for 256 KiB of
    brackets); for invalid JSON it may be anything, and the parser refuses the body anyway."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return 0
    # Within strings, an escaped backslash, then an escaped quote, is neither; every quote left delimits a string.
    structure = body.replace(_ESCAPED_BACKSLASH, b"").replace(_ESCAPED_QUOTE, b"").translate(None, _NOT_STRUCTURE)
    outside = b"".join(structure.split(b'"')[::2])
    return max(itertools.accumulate(array("b", outside.translate(_STEPS))), default=0)


def check_json(body: bytes, limit: int = MAX_DEPTH) -> None:
    """``DocumentError`` for a JSON body nested deeper than ``limit``."""
    if json_depth(body, limit) > limit:
        raise _too_deep(limit)
