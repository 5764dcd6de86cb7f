"""YAML in, with limits: what every spec, sweep file and `--set` value goes through before anything else sees it.

`yaml.safe_load` semantics (no tags beyond YAML's own, merge keys `<<:` included), plus what a hostile or broken file
must not be able to do to the process:

- read without end (`/dev/zero`, a FIFO that never closes) or for minutes (a 50 MB file): only regular files, at most
  MAX_FILE_BYTES, opened without blocking;
- exhaust the Python stack (`[[[[...` 1000 deep): the composer stops at MAX_DEPTH levels;
- raise `ValueError` from `int()` (a decimal literal over Python's 4300-digit limit): refused at its line;
- expand without bound (an alias bomb) or forever (a recursive alias): `check_structure` walks the loaded value once,
  without recursion, counting values as if every alias were expanded, and refuses cycles.

Each refusal is a `UserError` naming the file (or `--set` key), the place and the limit.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from archspec.errors import UserError, printable

MAX_FILE_BYTES = 1 << 20  # 1 MiB: the largest preset spec is 1 kB, the largest sweep file 2 kB
MAX_DEPTH = 64  # nesting levels (a spec is 5 deep, a sweep file with an inline base 8)
MAX_VALUES = 100_000  # scalars, lists and mappings once every alias is expanded
MAX_INT_DIGITS = 4300  # Python's own int() limit for decimal strings (sys.get_int_max_str_digits)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLLimitError(yaml.YAMLError):
    """A limit of ours hit while parsing; carries the position like PyYAML's own errors."""

    def __init__(self, problem: str, mark):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class StrictSafeLoader(yaml.SafeLoader):
    """yaml.safe_load's loader with the limits above, and a key given twice in one mapping is an error instead of
    "last one wins" (a key merged in with `<<:` may be overridden by an explicit one, as YAML specifies)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # PyYAML's composer recurses once per nesting level
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue  # flatten_mapping (in SafeConstructor.construct_mapping) merges it
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in seen:
                        raise ConstructorError("while constructing a mapping", node.start_mark,
                                               f"duplicate key {printable(repr(key), 80)}", key_node.start_mark)
                    seen.add(key)
                except TypeError:
                    pass  # unhashable keys: SafeLoader reports them itself
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_INT_DIGITS:
            raise YAMLLimitError(f"integer literal with {digits:,} digits (at most {MAX_INT_DIGITS})", node.start_mark)
        return super().construct_yaml_int(node)


StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", StrictSafeLoader.construct_yaml_int)


def parse(text: str) -> Any:
    """Parse YAML text with the limits; raises yaml.YAMLError (with a problem_mark where known)."""
    try:
        return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 (a SafeLoader subclass: safe_load semantics)
    except RecursionError:  # a structure the composer's depth limit did not see (defence in depth)
        raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels", None) from None


def read_text(path: str | Path, what: str) -> str:
    """A regular file's text, at most MAX_FILE_BYTES, UTF-8. Devices, FIFOs and sockets are refused without reading
    (opened non-blocking, so a FIFO with no writer does not hang the open either)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: no such {what} file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read {what} file: {e.strerror or e}") from None
    st = os.fstat(fd)  # before fdopen, which refuses a directory with an OSError of its own
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: is a directory, expected a {what} YAML file")
        raise UserError(f"{path}: not a regular file (a device, FIFO or socket); expected a {what} YAML file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_FILE_BYTES:
            raise UserError(f"{path}: {st.st_size:,} bytes; a {what} file may hold at most {MAX_FILE_BYTES:,}")
        try:
            data = f.read(MAX_FILE_BYTES + 1)  # the file may have grown since fstat
        except OSError as e:
            raise UserError(f"{path}: cannot read {what} file: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"{path}: more than {MAX_FILE_BYTES:,} bytes; a {what} file may hold at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: cannot read {what} file: not UTF-8 text (invalid byte at offset {e.start})") from None


def _path_text(path: tuple) -> str:
    return ".".join(printable(str(p), 40) for p in path) or "(top level)"


def check_structure(data: Any, origin: str, error: type[UserError] = UserError, *, max_depth: int = MAX_DEPTH,
                    max_values: int = MAX_VALUES) -> None:
    """Refuse a loaded value that is recursive, nested deeper than `max_depth`, or holds more than `max_values`
    values once shared (aliased) parts are counted every time they appear. One walk, no recursion, and it stops at
    the first limit, so it is cheap even on a bomb."""
    count = 0
    on_path: set[int] = set()
    stack: list[tuple[Any, int, tuple, bool]] = [(data, 0, (), False)]
    while stack:
        value, depth, path, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            continue
        count += 1
        if count > max_values:
            raise error(f"{origin}: more than {max_values:,} values once YAML aliases are expanded (an alias bomb?)")
        if not isinstance(value, (dict, list, tuple)):
            continue
        if id(value) in on_path:
            raise error(f"{origin}: {_path_text(path)}: a YAML alias refers to a value that contains it "
                        "(a recursive structure)")
        if depth >= max_depth:
            raise error(f"{origin}: {_path_text(path)}: nested deeper than {max_depth} levels")
        on_path.add(id(value))
        stack.append((value, depth, path, True))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((child, depth + 1, (*path, key), False) for key, child in items)


def variant_count_text(counts: list[int]) -> str:
    """A product of counts, written out while it is short, else as a power of ten (str() of a >4300-digit int
    would itself raise)."""
    log10 = sum(math.log10(c) for c in counts if c > 0)
    if log10 < 18:
        return f"{math.prod(counts):,}"
    return f"about 10^{log10:.0f}"


__all__ = ["MAX_FILE_BYTES", "MAX_DEPTH", "MAX_VALUES", "MAX_INT_DIGITS", "StrictSafeLoader", "YAMLLimitError",
           "parse", "read_text", "check_structure", "variant_count_text"]
