"""Text files, directories (every non-hidden file inside, sorted) and JSONL files (one document per line's `text`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Literal

from pydantic import Field

from archspec.data.base import CorpusKind, TextSource, register
from archspec.errors import UserError


@register
class FilesCorpus(CorpusKind):
    kind: Literal["files"] = "files"  # text files, directories (recursively) and .jsonl files (their `text` field)
    paths: list[str] = Field(min_length=1)

    def open(self) -> "FilesSource":
        return FilesSource(self.paths)

    @classmethod
    def strategy(cls, bound: int):
        from hypothesis import strategies as st

        # Any text: paths end up inside SPEC_JSON, which must stay an inert literal whatever they hold.
        return st.fixed_dictionaries({"paths": st.lists(st.text(max_size=20), min_size=1, max_size=3)})


class FilesSource(TextSource):
    """The files' documents in the order given (a directory's files sorted); the data hash is their content, not
    their paths."""

    def __init__(self, paths: list[str]):
        self.files = _expand_paths(paths)
        self.description = f"{len(self.files)} file{'s' * (len(self.files) != 1)} from {', '.join(paths)}"

    def documents(self) -> Iterator[str]:
        for path in self.files:
            if path.suffix == ".jsonl":
                yield from _jsonl_documents(path)
            else:
                text = _read_text(path)
                if text:
                    yield text


def _expand_paths(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for i, raw in enumerate(paths):
        where = f"train.data.corpus.paths[{i}]"
        path = Path(raw).expanduser()
        if path.is_dir():
            found = [p for p in sorted(path.rglob("*")) if p.is_file()
                     and not any(part.startswith(".") for part in p.relative_to(path).parts)]
            if not found:
                raise UserError(f"{where}: corpus directory {raw} holds no files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise UserError(f"{where}: {raw} is neither a file nor a directory")
        else:
            raise UserError(f"{where}: no such corpus file or directory: {raw}")
    return files


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read corpus file: {e.strerror or e}") from None


def _read_text(path: Path) -> str:
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (invalid byte at offset {e.start}); corpus files must be UTF-8") from None


def _jsonl_documents(path: Path) -> Iterator[str]:
    """One document per line's `text`, read line by line (a JSONL corpus may be larger than memory)."""
    line_no = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    text = _jsonl_text(path, line_no, line)
                    if text:
                        yield text
    except UnicodeDecodeError:
        raise UserError(f"{path}:{line_no + 1}: not UTF-8 text; corpus files must be UTF-8") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read corpus file: {e.strerror or e}") from None


def _jsonl_text(path: Path, line_no: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{line_no}: invalid JSON: {e.msg}") from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise UserError(f"{path}:{line_no}: expected an object with a string `text` field")
    return text
