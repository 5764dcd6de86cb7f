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


def human(n: float) -> str:
    """A count for a table: 2.66M, 410.24k, 61.09G; below a thousand, as is."""
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"
