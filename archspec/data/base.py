"""The data units' contract: one base per data family (corpus, tokenizer) and the registry of data kinds.

The same pattern as the model's kinds (archspec.kinds.base): a kind is one class, its spec fields and everything
else about it, registered into its family; the spec's unions (`train.data.corpus`, `train.data.tokenizer`), the JSON
Schema, the rules, the strategies, `archspec probe --task` and the registry's `probe.<task>.<key>` fields are built
from this registry, so nothing outside a unit switches on a data kind's name.

Data kinds are not KindUnits: they render no template, hold no parameters and have no HF mapping; what a unit holds
is how its text, examples or ids are made and what they contribute to the data hash. Cheap to import: numpy,
torch and the HF tokenizers load inside the methods that need them.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator, Protocol

from pydantic import BaseModel

from archspec.errors import UserError
from archspec.kinds.base import Family, Problem, Registry, Strict

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from hypothesis.strategies import SearchStrategy

    from archspec.spec.model import ModelSpec, Spec

CORPUS_PATH = ("train", "data", "corpus")
TOKENIZER_PATH = ("train", "data", "tokenizer")


class DataKind(Strict):
    """One kind of one data family. Subclasses declare `kind: Literal["..."] = "..."` and their own fields (and no
    docstring: pydantic would put it in the JSON Schema)."""

    family: ClassVar[str]

    @classmethod
    def kind_name(cls) -> str:
        return cls.model_fields["kind"].default

    def fill_defaults(self, spec: "Spec") -> None:
        """Write defaults that depend on other fields (so writing them explicitly keeps the hash)."""

    def problems(self, spec: "Spec") -> list[Problem]:
        """Rules relating this kind's fields to the rest of the spec (archspec.spec.rules)."""
        return []

    @classmethod
    def strategy(cls, bound: int) -> "SearchStrategy | None":
        """Hypothesis strategy for this kind's fields as a user writes them (without `kind`), or None when no valid
        value fits `bound` (a corpus: train.seq_len; a tokenizer: model.vocab_size)."""
        from archspec.kinds.introspect import fields_of

        return fields_of(cls)


# ── corpora ──────────────────────────────────────────────────────────────────────────────────────────────────────


class TextSource:
    """Documents in a fixed order, and the sha256 of their content (each prefixed by its length)."""

    description: str

    def documents(self) -> Iterator[str]:
        raise NotImplementedError

    @cached_property
    def content_hash(self) -> str:
        h, n_docs = hashlib.sha256(), 0
        for doc in self.documents():
            data = doc.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
            n_docs += 1
        if n_docs == 0:
            raise UserError(f"corpus is empty: {self.description} holds no text")
        return h.hexdigest()


class CorpusKind(DataKind):
    """What a run trains on. A text corpus (`task` false) opens a TextSource, which the token store tokenises and
    names by its `content_hash` (archspec.train.data); a task corpus is a TaskCorpusKind."""

    family: ClassVar[str] = "corpus"
    task: ClassVar[bool] = False  # capability task: examples generated in the task tokenizer's ids, not text
    carries_media: ClassVar[bool] = False  # its documents carry media (Flamingo): its source's `media_examples`

    def open(self) -> TextSource:
        raise NotImplementedError


# Capability tasks (archspec.train.tasks): synthetic examples written in the byte tokenizer's ids (ids below),
# generated from their own `seed` (the data, the same for every training seed), each exactly train.seq_len + 1
# tokens, with loss and accuracy on the answer positions only. MEDIA_MARK stands where a media task's item sits; a
# model with media input reads its own model.media.marker_id there (archspec.train.tasks.Examples.batch).
PAD, KEY_MARK, QUESTION, MEDIA_MARK, FIRST_SYMBOL = 0, 1, 2, 3, 4


class TaskCorpusKind(CorpusKind):
    """A capability task. Its data hash is its parameters and the window length (archspec.train.tasks.task_hash);
    the unit writes its examples (`fill`), says whether they fit a window (`fit_problems`), names its accuracy
    buckets, its chance accuracy and describes itself; `archspec probe --task` offers every registered task."""

    task: ClassVar[bool] = True
    probe_help: ClassVar[str] = ""  # a few words for `archspec probe --help`

    def open(self) -> TextSource:
        raise UserError(f"train.data.corpus: the {self.kind} task is generated as token ids, not read as text")

    def fit_problems(self, seq_len: int, where: tuple, length_name: str) -> list[Problem]:
        """Why this task cannot be written in windows of `seq_len + 1` tokens (empty: it can)."""
        return []

    def fill(self, rng: "np.random.Generator", tokens: "np.ndarray", answers: "np.ndarray", seq_len: int
             ) -> "np.ndarray":
        """Write the examples into `tokens` (n, seq_len + 1) uint8 and mark the answer targets in `answers`
        (n, seq_len); return each example's bucket (n,) int64 (-1: none)."""
        raise NotImplementedError

    def model_problems(self, m: "ModelSpec") -> list[Problem]:
        """Why model `m` cannot read this task's examples (a media task: the media's width and tokens per item), at
        paths under `model`; the spec's rules and `archspec probe` both ask."""
        return []

    def media(self, rng: "np.random.Generator", tokens: "np.ndarray") -> "np.ndarray | None":
        """A task whose answers lie in media: each example's items (n, items, tokens per item, width) float32, drawn
        after `fill` from the same stream and placed at its MEDIA_MARK tokens; None (the default): a text task."""
        return None

    def buckets(self) -> list[int]:
        """The accuracy buckets every scorer of this task starts with (so counts from several processes line up)."""
        return []

    @property
    def chance(self) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        return str(self.kind)

    def problems(self, spec: "Spec") -> list[Problem]:
        t, out = spec.train, []
        tok, ids = t.data.tokenizer, task_tokenizer()
        if not isinstance(tok, ids):
            out.append((TOKENIZER_PATH + ("kind",), f"the {self.kind} corpus is written in the {ids.kind_name()} "
                        f"tokenizer's ids; use {{kind: {ids.kind_name()}}}, got {tok.kind!r}", tok.kind))
        if t.seq_len is not None:
            out += self.fit_problems(t.seq_len, CORPUS_PATH, "train.seq_len")
        return out + self.model_problems(spec.model)


# ── tokenizers ───────────────────────────────────────────────────────────────────────────────────────────────────


class Tokenizer(Protocol):
    """What a built tokenizer offers (the loop, the token store, sampling and checkpoints use only this)."""

    kind: str
    vocab_size: int  # every id is < vocab_size
    eos_id: int
    identity: str  # names what its ids mean: keys caches and the data hash
    vocab_note: str  # for errors: where vocab_size comes from
    saves_file: bool  # whether `save(path)` writes it as a file other tools read (a run's tokenizer.json)

    def encode_batch(self, texts: list[str]) -> list["np.ndarray"]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def state(self) -> dict: ...

    def same_as(self, other: "Tokenizer") -> bool: ...

    def hf_files(self, model_max_length: int | None = None) -> dict[str, str]:
        """This tokenizer as the files of a transformers model directory (tokenizer.json, tokenizer_config.json,
        special_tokens_map.json; see archspec.data.tokenizer.common.hf_files) that AutoTokenizer loads with the same
        ids for every text (`archspec export-hf`)."""
        ...


class TokenizerKind(DataKind):
    """How text becomes ids. `build` makes the Tokenizer (from the corpus when `reads_corpus`); a checkpoint stores
    `Tokenizer.state()` (plain strings, `kind` and `identity` always) and `from_state` rebuilds it anywhere."""

    family: ClassVar[str] = "tokenizer"
    reads_corpus: ClassVar[bool] = True  # false: built without reading any text
    task_ids: ClassVar[bool] = False  # the capability tasks are written in this tokenizer's ids

    def build(self, corpus: TextSource | None, cache: Path | None) -> Tokenizer:
        """The tokenizer; `corpus` and `cache` may be None for a kind that does not read its corpus."""
        raise NotImplementedError

    @classmethod
    def state_problems(cls, state: dict) -> list[str]:
        """Why a stored state of this kind (kind and identity already checked) cannot be used."""
        return []

    @classmethod
    def from_state(cls, state: dict, where: str) -> Tokenizer:
        raise NotImplementedError

    def trainability_problems(self, m: "ModelSpec") -> list[str]:
        """Why `archspec train` cannot train `m` with this tokenizer, as `path: message` lines."""
        return []


# ── the registry ─────────────────────────────────────────────────────────────────────────────────────────────────


DataFamily = Family  # the model's family record (archspec.kinds.base)

_DATA = Registry("a data kind", [Family("corpus", CorpusKind, "stdlib"), Family("tokenizer", TokenizerKind, "byte")])
_FAMILIES = _DATA.families


def data_families() -> dict[str, DataFamily]:
    return dict(_FAMILIES)


def data_family(name: str) -> DataFamily:
    return _FAMILIES[name]


def corpus_kinds() -> dict[str, type[CorpusKind]]:
    return dict(_FAMILIES["corpus"].members)  # type: ignore[arg-type]


def task_kinds() -> dict[str, type[TaskCorpusKind]]:
    """The capability tasks, in registration order (`archspec probe --task`, `probe.<task>.<key>`)."""
    return {k: c for k, c in _FAMILIES["corpus"].members.items() if issubclass(c, TaskCorpusKind)}  # type: ignore


def tokenizer_kinds() -> dict[str, type[TokenizerKind]]:
    return dict(_FAMILIES["tokenizer"].members)  # type: ignore[arg-type]


def task_tokenizer() -> type[TokenizerKind]:
    """The tokenizer kind whose ids the capability tasks are written in."""
    return next(c for c in _FAMILIES["tokenizer"].members.values() if c.task_ids)  # type: ignore[misc]


def register(cls: type[DataKind]) -> type[DataKind]:
    """Add a data kind to its family (a decorator). The built-in kinds use it; so may a plugin, at any time: the
    spec classes are then rebuilt in place, as for the model's kinds."""
    return _DATA.register(cls)


def bind(family_name: str, owner: type[BaseModel], field_name: str) -> None:
    """Declare that `owner.field_name` holds `family_name`'s union (called by archspec.spec.train)."""
    _DATA.bind(family_name, owner, field_name)


def rebuild_order(*models: type[BaseModel]) -> None:
    """The models to rebuild, innermost first, when a data family gains a kind (called by archspec.spec.model)."""
    _DATA.rebuild_order(*models)
