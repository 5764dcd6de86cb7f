"""Data kinds: every corpus and every tokenizer is one self-contained unit, like the model's kinds (archspec.kinds).

A unit is one pydantic class (its spec fields, under `train.data.corpus` or `train.data.tokenizer`) that also
carries everything else about the kind:

- a text corpus (`corpus/stdlib.py`, `corpus/files.py`): how its documents are read (`open()` → a TextSource),
  whose `content_hash` is what it contributes to the data hash;
- a capability task (`corpus/mqar.py`, `corpus/passkey.py`): how its examples are written (`fill`), whether they
  fit a window (`fit_problems`), its accuracy buckets, chance accuracy and description (the scorer's and the
  probe's view of it); its data hash is its parameters (archspec.train.tasks.task_hash);
- a tokenizer (`tokenizer/byte.py`, `tokenizer/bpe.py`): the tokenizer it builds (`build`; its `identity` goes
  into the data hash), how it travels in a checkpoint (`state` / `from_state`) and its rules;
- its cross-field rules (`problems`), derived defaults (`fill_defaults`) and Hypothesis strategy (`strategy`).

The spec's unions, the JSON Schema, the rules, the strategies, `archspec probe --task` and the registry's
`probe.<task>.<key>` fields read the registry (archspec.data.base), so nothing outside a unit names a data kind.
The shared machinery stays where it was: the token store and windows in archspec.train.data, the examples, scorer
and samplers of the tasks in archspec.train.tasks, the tokenizer's checkpoint plumbing in archspec.train.tokenizer.

Adding a kind:

    from typing import Literal
    from archspec.data import CorpusKind, register

    @register
    class Shakespeare(CorpusKind):
        kind: Literal["shakespeare"] = "shakespeare"

        def open(self): ...   # a TextSource
"""

from __future__ import annotations

from archspec.data.base import (CorpusKind, DataFamily, DataKind, TaskCorpusKind, TextSource, Tokenizer,
                                TokenizerKind, corpus_kinds, data_families, data_family, register, task_kinds,
                                task_tokenizer, tokenizer_kinds)

__all__ = [
    "CorpusKind", "DataFamily", "DataKind", "TaskCorpusKind", "TextSource", "Tokenizer", "TokenizerKind",
    "corpus_kinds", "data_families", "data_family", "register", "task_kinds", "task_tokenizer", "tokenizer_kinds",
]

# The built-in kinds register themselves on import, through the same `register` a plugin uses.
from archspec.data import corpus as _corpus  # noqa: F401
from archspec.data import tokenizer as _tokenizer  # noqa: F401
