"""Tokenizers: byte-level (the default, nothing to train) and byte-level BPE trained locally with HF `tokenizers`.

Both map text to ids below `vocab_size` and reserve one id for EOS, which the token store puts between documents.
A tokenizer's `identity` names what its ids mean (kind, and for BPE the corpus and size it was trained for), so it
can key caches and the run's data hash; it is the same on every machine that asks for the same tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Protocol

import numpy as np

from archspec.errors import UserError
from archspec.spec.train import BPETokenizer as BPETokenizerSpec
from archspec.spec.train import ByteTokenizer as ByteTokenizerSpec
from archspec.train.cache import atomic_write_text, digest, writing_cache

EOS_TEXT = "<|endoftext|>"
_FORMAT = 1  # bump when the meaning of ids for the same request changes (invalidates every cache entry)


class Tokenizer(Protocol):
    kind: str
    vocab_size: int  # every id is < vocab_size
    eos_id: int
    identity: str

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; EOS is 256."""

    kind = "byte"
    vocab_size = 257
    eos_id = 256
    identity = digest("byte", _FORMAT)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation), EOS is id 0. Text that spells EOS_TEXT stays text."""

    kind = "bpe"

    def __init__(self, hf_tokenizer, identity: str):
        hf_tokenizer.encode_special_tokens = True  # a document quoting "<|endoftext|>" must not end there
        self._hf = hf_tokenizer
        self.identity = identity
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eos_id = hf_tokenizer.token_to_id(EOS_TEXT)

    @classmethod
    def train(cls, documents: Iterator[str], vocab_size: int, identity: str) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, whatever the corpus
            show_progress=False,
        )
        hf.train_from_iterator(documents, trainer=trainer)
        return cls(hf, identity)

    @classmethod
    def load(cls, path: Path, identity: str) -> "BPETokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), identity)

    def save(self, path: Path) -> None:
        atomic_write_text(path, self._hf.to_str())

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.uint32) for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=True)


# ── the tokenizer travels with the model ─────────────────────────────────────────────────────────────────────────
# A checkpoint holds its tokenizer (`tokenizer_state`), and a run directory holds a BPE tokenizer as
# tokenizer.json, so `archspec sample` works on a machine whose cache has never seen the corpus.

TOKENIZER_FILE = "tokenizer.json"  # HF `tokenizers` JSON, beside a run's checkpoint


def tokenizer_state(tokenizer: Tokenizer) -> dict:
    """What a checkpoint stores to rebuild `tokenizer` anywhere: plain strings only (a safe torch.load reads it)."""
    if tokenizer.kind == "bpe":
        return {"kind": "bpe", "identity": tokenizer.identity, "json": tokenizer._hf.to_str()}
    return {"kind": tokenizer.kind, "identity": tokenizer.identity}


def tokenizer_state_problems(state) -> list[str]:
    """Why a checkpoint's `tokenizer` entry cannot be used (empty: usable)."""
    if not isinstance(state, dict) or state.get("kind") not in ("byte", "bpe"):
        return ["tokenizer: expected a mapping with kind 'byte' or 'bpe'"]
    if not isinstance(state.get("identity"), str):
        return ["tokenizer.identity: expected text"]
    if state["kind"] == "bpe" and not isinstance(state.get("json"), str):
        return ["tokenizer.json: expected the tokenizer's JSON text"]
    return []


def tokenizer_from_state(state: dict, where: str) -> Tokenizer:
    """The tokenizer a checkpoint stored (see `tokenizer_state`); `where` names the file in errors."""
    problems = tokenizer_state_problems(state)
    if problems:
        raise UserError(f"{where}: unusable tokenizer", problems)
    if state["kind"] == "byte":
        return ByteTokenizer()
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_str(state["json"])
    except Exception as e:  # the tokenizers library raises its own exception types
        raise UserError(f"{where}: the stored BPE tokenizer does not load: {str(e)[:200]}") from None
    if hf.token_to_id(EOS_TEXT) is None:
        raise UserError(f"{where}: the stored BPE tokenizer has no {EOS_TEXT} token")
    return BPETokenizer(hf, state["identity"])


def load_tokenizer_file(path: Path) -> Tokenizer:
    """A BPE tokenizer from a run directory's tokenizer.json."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read tokenizer: {e}") from None
    return tokenizer_from_state({"kind": "bpe", "identity": digest("bpe-file", _FORMAT, text), "json": text}, str(path))


def build_tokenizer(spec: ByteTokenizerSpec | BPETokenizerSpec, corpus, cache: Path) -> Tokenizer:
    """The tokenizer a recipe asks for; BPE is trained on `corpus` once and then read from `cache`."""
    if spec.kind == "byte":
        return ByteTokenizer()
    if spec.vocab_size is None:
        raise UserError("train.data.tokenizer.vocab_size: required for a BPE tokenizer (default: model.vocab_size)")
    identity = digest("bpe", _FORMAT, corpus.content_hash, spec.vocab_size)
    path = cache / "tokenizers" / f"bpe-{identity[:24]}.json"
    if path.exists():
        try:
            return BPETokenizer.load(path, identity)
        except Exception:  # a damaged cache entry is rebuilt, not trusted
            path.unlink(missing_ok=True)
    tokenizer = BPETokenizer.train(corpus.documents(), spec.vocab_size, identity)
    with writing_cache(cache):
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(path)
    return tokenizer
