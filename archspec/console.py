"""One place for terminal output: consoles that fit the terminal (and honour $COLUMNS), tables that drop columns
rather than cut run ids, and the one number format every table uses."""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Sequence

import click
from rich.console import Console
from rich.errors import MarkupError
from rich.measure import Measurement
from rich.table import Table

from archspec.errors import printable

MAX_COLUMNS = 10_000  # a $COLUMNS beyond this is not a terminal (rich would lay out a table that wide)
PIPED_WIDTH = 160  # output to a pipe or a file, when $COLUMNS does not say: wide enough for a typical table


def terminal_width(stream=None) -> int | None:
    """$COLUMNS when set (a number), else the terminal's width (None: let rich ask), else PIPED_WIDTH."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isascii() and columns.isdigit() and 0 < int(columns) <= MAX_COLUMNS:  # else: not a width, ignored
        return int(columns)
    stream = stream or sys.stdout
    return None if stream.isatty() else PIPED_WIDTH


class MarkupConsole(Console):
    """A console for archspec's own messages, which use rich markup (`[bold]...[/]`) around values that may come from
    the user (a path, a spec name). Control characters are escaped in every line (newlines kept), so no value can
    rewrite the terminal; a value that happens to read as broken markup (`a[/]b`) is shown as plain text rather than
    raising rich's MarkupError."""

    def render_str(self, text: str, **kwargs):
        safe = shown(text)
        try:
            return super().render_str(safe, **kwargs)
        except MarkupError:
            return super().render_str(safe, **{**kwargs, "markup": False})


class DataConsole(Console):
    """A console for showing stored or user-supplied data (run names, tags, paths, errors): every string is shown as
    it is, never as rich markup, and with control characters escaped (newlines kept), so a value holding
    `\x1b[2J` or `\r` cannot rewrite the terminal. `Text` objects built by the caller are its own business."""

    def render_str(self, text: str, **kwargs):
        kwargs["markup"] = False
        return super().render_str(shown(text), **kwargs)


def shown(text: str) -> str:
    """Text for the terminal: every line printable (control characters escaped), the line breaks kept."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}


def terminal_text(text: str) -> str:
    """Generated text as it streams (`archspec sample`): tabs and line breaks stay, every other control character
    (ESC, CR, BEL, the C1 range) is shown escaped, so a model cannot write terminal codes."""
    return text.translate(_CONTROL)


def echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    """click.echo for every line archspec prints: a value inside (a path, a run name, a stored error) cannot put a
    control character on the terminal. JSON output passes unchanged (json.dumps writes ASCII escapes)."""
    click.echo(shown(message), err=err, nl=nl)


def make_console(stderr: bool = False, data: bool = False) -> Console:
    """`data`: a DataConsole, for output that shows stored or user-supplied text."""
    stream = sys.stderr if stderr else sys.stdout
    return (DataConsole if data else MarkupConsole)(stderr=stderr, width=terminal_width(stream), soft_wrap=False)


def human(n: float) -> str:
    """A count for a table: 2.66M, 410.24k, 61.09G; below a thousand, as is."""
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def byte_size(n: int) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1: `512 B`, `4.7 MiB`."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


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


def is_mfu_key(name: str) -> bool:
    """A recorded value that is an MFU (`mfu`, `mfu_palm`, `summary.mfu`, `metrics.last.mfu`), not its flag: one above
    1 (100%) says the measured ceiling is too low, so tables show it as "above ceiling", never as a figure."""
    last = name.rsplit(".", 1)[-1]
    return last == "mfu" or last.startswith("mfu_") and last != "mfu_above_ceiling"


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


class Tracker:
    """A command's own progress on stderr (rich): a bar with the work done, elapsed time and an ETA, for commands that
    take more than a couple of seconds (quantize, mup-check, a sweep). `update` moves it; a disabled tracker (and
    `NULL_TRACKER`) does nothing, so the work never branches on whether it is shown."""

    def __init__(self, description: str = "", total: float | None = None, enabled: bool = True,
                 console: Console | None = None):
        self.enabled = enabled
        self._progress = None
        self._task = None
        if enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(),
                                      TextColumn("ETA"), TimeRemainingColumn(),
                                      console=console or make_console(stderr=True),
                                      transient=True)  # gone when done: the command's result (or error) stands alone
            self._task = self._progress.add_task(printable(description, 120), total=total)

    def __enter__(self) -> "Tracker":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, description: str | None = None, advance: float = 0.0, total: float | None = None) -> None:
        if self._progress is None:
            return
        fields: dict[str, Any] = {"advance": advance}
        if description is not None:
            fields["description"] = printable(description, 120)
        if total is not None:
            fields["total"] = total
        self._progress.update(self._task, **fields)

    def log(self, message: str) -> None:
        """A line above the bar (or on stderr when the bar is off)."""
        if self._progress is not None:
            self._progress.console.print(message, highlight=False)


NULL_TRACKER = Tracker(enabled=False)


def program() -> str:
    """The archspec command as this process was invoked, for commands printed to be run again (a resume command, a
    follow-up): `archspec` when it was found on PATH, its absolute path when it was invoked by one
    (`.venv/bin/archspec`), `python -m archspec` (this interpreter) under -m. Shell-quoted."""
    import shlex

    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if name in ("__main__.py", "entry.py") or argv0 in ("-m", "-c", ""):
        return f"{shlex.quote(sys.executable)} -m archspec"
    if os.sep in argv0 or (os.altsep and os.altsep in argv0):
        return shlex.quote(os.path.abspath(argv0))
    return shlex.quote(name) if name else "archspec"
