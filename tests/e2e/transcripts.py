"""The docs' transcripts as data: the shell blocks of a Markdown section, what each command is shown to print, and a
comparison by shape (numbers, times, durations, ids, paths and tokens normalised away; then line by line).

A transcript is a fenced block with lines that begin with ``$ ``: each is a command, the lines after it until the
next are what it printed, a last ``(exit N)`` the exit code it ended with, and a line ``...`` stands for lines left
out. HTML comments right above the fence steer the test that runs them:

- ``<!-- transcript: skip: WHY -->``: not run (say why: a GPU, a second user, minutes of training ...);
- ``<!-- transcript: fresh -->``: run on a kiln up of its own, on a fresh KILN_HOME (the ids start again at 1);
- ``<!-- transcript: before: COMMAND -->``: a command run first, its output not compared (it must exit 0).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

ELIDED = "..."
DIRECTIVE = re.compile(r"^<!--\s*transcript:\s*(skip|fresh|before)\s*:?\s*(.*?)\s*-->$")


@dataclass
class Command:
    line: str  # as typed, without the "$ "
    shown: list[str] = field(default_factory=list)  # the output the docs show
    exit_code: int | None = None  # from a "(exit N)" line, where the docs say it
    after_interrupt: list[str] = field(default_factory=list)  # a foreground `kiln up`: what it prints on Ctrl-C


@dataclass
class Block:
    source: str  # "docs/cli.md:231"
    commands: list[Command]
    skip: str | None = None
    fresh: bool = False
    before: list[str] = field(default_factory=list)


def section(markdown: str, heading: str) -> tuple[str, int]:
    """The text under ``heading`` up to the next heading of the same or a higher level, and its first line's number."""
    lines = markdown.splitlines()
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(rf"^#{{1,{level}}} ", lines[i])),
        len(lines),
    )
    return "\n".join(lines[start:end]), start


def blocks(path: Path, root: Path, heading: str | None = None) -> list[Block]:
    """Every transcript block of the file (or of one section of it), in order."""
    text, offset = (path.read_text(), 0) if heading is None else section(path.read_text(), heading)
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = lines[i + 1 : end]
        if any(line.startswith("$ ") for line in body):
            block = Block(f"{path.relative_to(root)}:{offset + i + 1}", parse_commands(body))
            apply_directives(block, lines, i)
            found.append(block)
        i = end + 1
    return found


def parse_commands(body: list[str]) -> list[Command]:
    commands: list[Command] = []
    interrupted = False
    for line in body:
        if line.startswith("$ "):
            commands.append(Command(line[2:]))
            interrupted = False
        elif not commands:
            continue
        elif line == "^C":
            interrupted = True
        elif m := re.fullmatch(r"\(exit (\d+)\)", line):
            commands[-1].exit_code = int(m.group(1))
        elif interrupted:
            commands[-1].after_interrupt.append(line)
        else:
            commands[-1].shown.append(line)
    return commands


def apply_directives(block: Block, lines: list[str], fence: int) -> None:
    """The ``<!-- transcript: ... -->`` comments right above the fence (blank lines between are allowed)."""
    j = fence - 1
    while j >= 0 and (not lines[j].strip() or DIRECTIVE.match(lines[j].strip())):
        if m := DIRECTIVE.match(lines[j].strip()):
            kind, value = m.groups()
            if kind == "skip":
                block.skip = value or "no reason given"
            elif kind == "fresh":
                block.fresh = True
            else:
                block.before.insert(0, value)
        j -= 1


# Order matters: a timestamp before its numbers, a duration before a bare number, a URL's host before paths.
NORMALISE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"kiln_[\w\-…]*"), "kiln_<token>"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?(Z| UTC|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\dZ\b"), "<time>"),
    (re.compile(r"https?://[\w.\-]+(:\d+)?"), "<url>"),
    (re.compile(r"(?<![\w>.])/{1,4}(?:[\w.@+\-…]+/)*[\w.@+\-…]+/?"), "<path>"),
    (re.compile(r"\b[0-9a-f]*\d[0-9a-f]*[a-f][0-9a-f]*\b|\b[0-9a-f]*[a-f][0-9a-f]*\d[0-9a-f]*\b"), "<hex>"),
    (re.compile(r"\b\d+:\d\d:\d\d\b"), "<dur>"),
    (re.compile(r"[-+]?\b(\d+d)?(\d+h)?(\d+m)?\d+(\.\d+)?(ms|s)\b|[-+]?\b\d+(h\d\dm|m\d\ds|m|h|d)\b"), "<dur>"),
    (re.compile(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalise(line: str, host: str = "vm") -> str:
    """A line's shape: what stays the same from one run to the next."""
    if host != "vm":
        line = re.sub(rf"\b{re.escape(host)}\b", "vm", line)
    for pattern, replacement in NORMALISE:
        line = pattern.sub(replacement, line)
    return line.strip()


def shapes(lines: list[str], host: str = "vm") -> list[str]:
    return [shape for shape in (normalise(line, host) for line in lines) if shape]


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line; an ``...`` in ``expected`` takes any number of lines."""
    if not expected:
        return not actual
    if expected[0] == ELIDED:
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def disagreement(source: str, command: str, shown: list[str], printed: list[str], host: str = "vm") -> str | None:
    """None when the output has the docs' shape; else what differs, as a diff of the two shapes."""
    expected, actual = shapes(shown), shapes(printed, host)
    if matches(expected, actual):
        return None
    diff = difflib.unified_diff(expected, actual, "docs (shape)", "printed (shape)", lineterm="", n=1)
    return (
        f"{source}: `$ {command}` printed something else:\n"
        + "\n".join(diff)
        + "\n--- printed:\n"
        + "\n".join(printed[-80:])
    )
