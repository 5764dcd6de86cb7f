"""Tokenizers: how a built tokenizer travels with a run, over the tokenizer kinds of archspec.data.

Each tokenizer kind is a unit (archspec/data/tokenizer/: `byte`, the default, nothing to train; `bpe`, byte-level
BPE trained locally with HF `tokenizers`). Every tokenizer maps text to ids below `vocab_size` and reserves one id for
EOS, which the token store puts between documents. A tokenizer's `identity` names what its ids mean (kind, and for
BPE the corpus and size it was trained for), so it can key caches and the run's data hash; it is the same on every
machine that asks for the same tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from archspec.data.base import TextSource, Tokenizer, TokenizerKind, tokenizer_kinds
from archspec.data.tokenizer.bpe import file_state
from archspec.errors import UserError

__all__ = ["TOKENIZER_FILE", "Tokenizer", "build_tokenizer",
           "checkpoint_tokenizer", "load_tokenizer_file", "tokenizer_from_state", "tokenizer_state", "tokenizer_state_problems"]


# ── the tokenizer travels with the model ─────────────────────────────────────────────────────────────────────────
# A checkpoint holds its tokenizer (`tokenizer_state`), and a run directory holds a BPE tokenizer as
# tokenizer.json, so `archspec sample` works on a machine whose cache has never seen the corpus.

TOKENIZER_FILE = "tokenizer.json"  # HF `tokenizers` JSON, beside a run's checkpoint


def tokenizer_state(tokenizer: Tokenizer) -> dict:
    """What a checkpoint stores to rebuild `tokenizer` anywhere: plain strings only (a safe torch.load reads it)."""
    return tokenizer.state()


def tokenizer_state_problems(state) -> list[str]:
    """Why a checkpoint's `tokenizer` entry cannot be used (empty: usable)."""
    kinds = tokenizer_kinds()
    if not isinstance(state, dict) or state.get("kind") not in tuple(kinds):
        return [f"tokenizer: expected a mapping with kind {' or '.join(repr(k) for k in kinds)}"]
    if not isinstance(state.get("identity"), str):
        return ["tokenizer.identity: expected text"]
    return kinds[state["kind"]].state_problems(state)


def tokenizer_from_state(state: dict, where: str) -> Tokenizer:
    """The tokenizer a checkpoint stored (see `tokenizer_state`); `where` names the file in errors."""
    problems = tokenizer_state_problems(state)
    if problems:
        raise UserError(f"{where}: unusable tokenizer", problems)
    return tokenizer_kinds()[state["kind"]].from_state(state, where)


def load_tokenizer_file(path: Path) -> Tokenizer:
    """A BPE tokenizer from a run directory's tokenizer.json."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read tokenizer: {e}") from None
    return tokenizer_from_state(file_state(text), str(path))


def checkpoint_tokenizer(path: Path, state: dict | None, spec) -> Tokenizer:
    """A training checkpoint's own tokenizer (`state`: its "tokenizer" entry); for a checkpoint saved before
    tokenizers travelled with it (None), the run directory's tokenizer.json, or the recipe's tokenizer when it is
    built from nothing (the byte tokenizer). `archspec sample` and `archspec export-hf` ask this."""
    if state is not None:
        return tokenizer_from_state(state, str(path))
    beside = path.parent / TOKENIZER_FILE
    if beside.is_file():
        return load_tokenizer_file(beside)
    if not spec.train.data.tokenizer.reads_corpus:
        return spec.train.data.tokenizer.build(None, None)
    raise UserError(f"{path}: holds no tokenizer and there is no {TOKENIZER_FILE} beside it; this run's BPE tokenizer "
                    "cannot be rebuilt without its corpus")


def build_tokenizer(spec: TokenizerKind, corpus: TextSource | None, cache: Path) -> Tokenizer:
    """The tokenizer a recipe asks for; one that reads its corpus (BPE) is trained on it once, then read from
    `cache`."""
    return spec.build(corpus, cache)
