"""The running Python's standard-library sources, test suites excluded (~13 MB): present on every machine."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Iterator, Literal

from archspec.data.base import CorpusKind, TextSource, register

_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@register
class StdlibCorpus(CorpusKind):
    kind: Literal["stdlib"] = "stdlib"  # the running Python's standard-library sources: ~13 MB, always present

    def open(self) -> "StdlibSource":
        return StdlibSource()


class StdlibSource(TextSource):
    """The stdlib's .py files in sorted order; the data hash is their content (so it follows the Python version)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root or sysconfig.get_paths()["stdlib"])
        self.files = [
            p for p in sorted(self.root.rglob("*.py"))
            if p.is_file() and not _STDLIB_SKIP.intersection(p.relative_to(self.root).parts)
        ]
        self.description = f"python{sys.version_info.major}.{sys.version_info.minor} stdlib ({len(self.files)} files)"

    def documents(self) -> Iterator[str]:
        for path in self.files:
            text = path.read_bytes().decode("utf-8", errors="replace")  # a stray latin-1 byte is not worth a refusal
            if text:
                yield text
