"""One place for terminal output: consoles that fit the terminal (and honour $COLUMNS), tables that drop columns
rather than cut run ids, and the one number format every table uses."""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from archspec.errors import printable

PIPED_WIDTH = 160  # output to a pipe or a file, when $COLUMNS does not say: wide enough for a typical table


def terminal_width(stream=None) -> int | None:
    """$COLUMNS when set (a number), else the terminal's width (None: let rich ask), else PIPED_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream or sys.stdout
    return None if stream.isatty() else PIPED_WIDTH


class DataConsole(Console):
    """A console for showing stored or user-supplied data (run names, tags, paths, errors): every string is shown as
    it is, never as rich markup, and with control characters escaped (newlines kept), so a value holding
    `\x1b[2J` or `\r` cannot rewrite the terminal. `Text` objects built by the caller are its own business."""

    def render_str(self, text: str, **kwargs):
        kwargs["markup"] = False
        safe = "\n".join(printable(line) for line in text.split("\n"))
        return super().render_str(safe, **kwargs)


def make_console(stderr: bool = False, data: bool = False) -> Console:
    """`data`: a DataConsole, for output that shows stored or user-supplied text."""
    stream = sys.stderr if stderr else sys.stdout
    return (DataConsole if data else Console)(stderr=stderr, width=terminal_width(stream), soft_wrap=False)


def human(n: float) -> str:
    """A count for a table: 2.66M, 410.24k, 61.09G; below a thousand, as is."""
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def number(v: Any) -> str:
    """The one number format of every table: integers and values from 1,000 up as counts (51.10k, 795.80k, 1.20G);
    smaller values to 4 significant digits without an exponent (3.207, 0.0412); tiny ones in scientific form
    (3.000e-05). NaN and infinities by name."""
    if isinstance(v, bool):
        return "true" if v else "false"
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if abs(v) >= 1000:
        return human(v)
    if v.is_integer():
        return str(int(v))
    if abs(v) >= 1e-3:
        digits = max(0, 3 - math.floor(math.log10(abs(v))))
        return f"{v:.{digits}f}".rstrip("0").rstrip(".")
    return f"{v:.3e}"


def fit_columns(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Any]], keep: int,
                make_table) -> tuple[Table, int]:
    """Build the table with as many trailing columns as fit the console's width, never fewer than `keep`: a table
    that is too wide loses its last columns whole, rather than rich cutting every cell (run ids included) to
    fragments. Returns (table, number of columns left out). `make_table(headers, rows)` builds a table."""
    n = len(headers)
    while True:
        table = make_table(headers[:n], [row[:n] for row in rows])
        # Measured without the console's width limit (rich clamps a measurement to it).
        width = Measurement.get(console, console.options.update_width(1 << 20), table).maximum
        if width <= console.width or n <= keep:
            return table, len(headers) - n
        n -= 1


def dropped_note(dropped: int, console: Console) -> str:
    """What a table left out to fit, and how to see it; '' when nothing was."""
    if not dropped:
        return ""
    return (f"; {dropped} column{'s' if dropped != 1 else ''} left out to fit {console.width} columns "
            "(a wider terminal, COLUMNS=N, or --format csv shows them)")
