"""Runs the archive command (``python -m core.code_archive extract ...``)."""

import sys

from .command import main

sys.exit(main())
