"""``python -m core.code_archive extract``: the worker's sandboxed unpacking as a command."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NoReturn

from .base import DIGEST_PATTERN, ArchiveError, ArchiveLimits
from .unpack import extract, extract_file

EX_DATAERR = 65


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _digest(text: str) -> str:
    if re.fullmatch(DIGEST_PATTERN, text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a SHA-256 in lower-case hex")
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m core.code_archive extract --archive PATH --digest SHA256 --dest DIR --max-unpacked-bytes N
    --max-entries N`` (``--archive -``: the archive on standard input): prints {"entries": N, "unpacked_bytes": N}
    and exits 0; an archive that breaks a rule (a digest that does not match, a destination not empty): the
    reason on stderr, exit 65 (EX_DATAERR); anything else (bad arguments, I/O): exit 1."""
    parser = _Parser(prog="python -m core.code_archive", description="kiln's code archives")
    commands = parser.add_subparsers(dest="command", required=True)
    ex = commands.add_parser("extract", help="verify an archive and unpack it into an empty directory")
    ex.add_argument("--archive", required=True, help="the .tar.gz ('-': standard input)")
    ex.add_argument("--digest", type=_digest, required=True, help="its SHA-256 (hex)")
    ex.add_argument("--dest", type=Path, required=True, help="an empty directory (made if missing)")
    ex.add_argument("--max-unpacked-bytes", type=_count, required=True)
    ex.add_argument("--max-entries", type=_count, required=True)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or bad arguments (1)
        return exc.code if isinstance(exc.code, int) else 1
    limits = ArchiveLimits(max_unpacked_bytes=args.max_unpacked_bytes, max_entries=args.max_entries)
    try:
        if args.archive == "-":
            summary = extract_file(sys.stdin.buffer, args.digest, args.dest, limits)
        else:
            summary = extract(Path(args.archive), args.digest, args.dest, limits)
    except ArchiveError as exc:
        print(f"archive refused: {exc}", file=sys.stderr)
        return EX_DATAERR
    except Exception as exc:
        print(f"extract failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"entries": summary.entries, "unpacked_bytes": summary.unpacked_bytes}))
    return 0
