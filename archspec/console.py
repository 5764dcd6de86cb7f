"""One place that makes rich consoles: full width in a terminal, and a wide fixed width when output is piped or
captured (rich's 80-column default folds every table cell into a column of fragments)."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPED_WIDTH
    return Console(stderr=stderr, width=width)
