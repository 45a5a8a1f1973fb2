"""Regenerate the initial migration from the models (allowed only while nothing has been released).

Usage: .venv/bin/python scripts/regen_initial_migration.py   (needs the local PostgreSQL)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from alembic import command

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.migrate import alembic_config  # noqa: E402

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = f"kiln_regen_{os.getpid()}"


def main() -> None:
    versions = ROOT / "migrations" / "versions"
    for old in versions.glob("*-0001_*.py"):
        old.unlink()
    # Later revisions (data seeds) are set aside so that the empty database counts as "up to date".
    later = [(p, p.with_suffix(".aside")) for p in versions.glob("*.py")]
    for path, aside in later:
        path.rename(aside)
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DB}"')
    try:
        cfg = alembic_config(f"postgresql+psycopg://postgres@127.0.0.1:5432/{DB}")
        cfg.set_main_option(
            "file_template", "2026_11_29_0900-%%(rev)s_%%(slug)s"
        )  # fixed, so regenerating is idempotent
        command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
    finally:
        for path, aside in later:
            aside.rename(path)
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}"')
    subprocess.run([sys.executable, "-m", "ruff", "format", str(versions)], check=False, capture_output=True)


if __name__ == "__main__":
    main()
