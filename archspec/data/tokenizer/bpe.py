"""Byte-level BPE (GPT-2 style pre-tokenisation) trained locally with HF `tokenizers` on the run's corpus, cached by
the corpus's content hash and the size. EOS is id 0; text that spells EOS_TEXT stays text. It travels with a run: a
checkpoint stores its JSON, and a run directory holds it as tokenizer.json."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Literal

from pydantic import Field

from archspec.data.base import TOKENIZER_PATH, TokenizerKind, register
from archspec.data.tokenizer.common import EOS_TEXT, FORMAT, hf_files
from archspec.errors import UserError
from archspec.cache import atomic_write_text, digest, writing_cache

BPE_MIN_VOCAB = 260  # 256 bytes + specials + merges


@register
class BPETokenizer(TokenizerKind):
    kind: Literal["bpe"] = "bpe"  # byte-level BPE trained locally with HF tokenizers, cached by content hash
    vocab_size: int | None = Field(None, ge=260, le=1 << 20, description="default: model.vocab_size")

    def fill_defaults(self, spec) -> None:
        if self.vocab_size is None:
            object.__setattr__(self, "vocab_size", spec.model.vocab_size)

    def problems(self, spec):
        m = spec.model
        if self.vocab_size is not None and self.vocab_size < BPE_MIN_VOCAB:
            return [(TOKENIZER_PATH + ("vocab_size",),
                     f"must be at least {BPE_MIN_VOCAB} for a BPE tokenizer (256 bytes + specials + merges), got "
                     f"{self.vocab_size} (it defaults to model.vocab_size)", self.vocab_size)]
        if self.vocab_size is not None and self.vocab_size > m.vocab_size:
            return [(TOKENIZER_PATH + ("vocab_size",),
                     f"must be at most model.vocab_size ({m.vocab_size}), got {self.vocab_size}", self.vocab_size)]
        return []

    def trainability_problems(self, m) -> list[str]:
        if self.vocab_size is None and m.vocab_size < BPE_MIN_VOCAB:
            return [f"model.vocab_size: must be at least {BPE_MIN_VOCAB} for train.data.tokenizer (bpe, whose "
                    f"vocab_size defaults to model.vocab_size), got {m.vocab_size}"]
        return []

    @classmethod
    def strategy(cls, bound: int):
        """A byte-level BPE needs at least 260 ids and at most model.vocab_size (`bound`); an omitted vocab_size
        means model.vocab_size, so small models draw no BPE tokenizer at all."""
        from hypothesis import strategies as st

        from archspec.kinds.introspect import fields_of

        return fields_of(cls, {"vocab_size": st.integers(BPE_MIN_VOCAB, bound)}) if bound >= BPE_MIN_VOCAB else None

    def build(self, corpus, cache: Path) -> "BPECodec":
        """Trained on `corpus` once, then read from `cache`."""
        if self.vocab_size is None:
            raise UserError("train.data.tokenizer.vocab_size: required for a BPE tokenizer (default: model.vocab_size)")
        identity = digest(self.kind, FORMAT, corpus.content_hash, self.vocab_size)  # part of the data hash
        path = cache / "tokenizers" / f"{self.kind}-{identity[:24]}.json"
        if path.exists():
            try:
                return BPECodec.load(path, identity)
            except Exception:  # a damaged cache entry is rebuilt, not trusted
                path.unlink(missing_ok=True)
        tokenizer = BPECodec.train(corpus.documents(), self.vocab_size, identity)
        with writing_cache(cache):
            path.parent.mkdir(parents=True, exist_ok=True)
            tokenizer.save(path)
        return tokenizer

    @classmethod
    def state_problems(cls, state: dict) -> list[str]:
        if not isinstance(state.get("json"), str):
            return ["tokenizer.json: expected the tokenizer's JSON text"]
        return []

    @classmethod
    def from_state(cls, state: dict, where: str) -> "BPECodec":
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer.from_str(state["json"])
        except Exception as e:  # the tokenizers library raises its own exception types
            raise UserError(f"{where}: the stored BPE tokenizer does not load: {str(e)[:200]}") from None
        if hf.token_to_id(EOS_TEXT) is None:
            raise UserError(f"{where}: the stored BPE tokenizer has no {EOS_TEXT} token")
        return BPECodec(hf, state["identity"])


def file_state(text: str) -> dict:
    """The state of a BPE tokenizer read from a tokenizer.json file (its identity: the file's content)."""
    return {"kind": BPETokenizer.kind_name(), "identity": digest("bpe-file", FORMAT, text), "json": text}


class BPECodec:
    """Byte-level BPE (GPT-2 style pre-tokenisation), EOS is id 0. Text that spells EOS_TEXT stays text."""

    kind = BPETokenizer.kind_name()
    vocab_note = "as trained"
    saves_file = True  # `save` writes the HF tokenizers JSON (a run directory's tokenizer.json)

    def __init__(self, hf_tokenizer, identity: str):
        hf_tokenizer.encode_special_tokens = True  # a document quoting "<|endoftext|>" must not end there
        self._hf = hf_tokenizer
        self.identity = identity
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eos_id = hf_tokenizer.token_to_id(EOS_TEXT)

    @classmethod
    def train(cls, documents: Iterator[str], vocab_size: int, identity: str) -> "BPECodec":
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
    def load(cls, path: Path, identity: str) -> "BPECodec":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), identity)

    def save(self, path: Path) -> None:
        atomic_write_text(path, self._hf.to_str())

    def encode_batch(self, texts: list[str]):
        import numpy as np

        return [np.asarray(e.ids, dtype=np.uint32) for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def state(self) -> dict:
        return {"kind": self.kind, "identity": self.identity, "json": self._hf.to_str()}

    def hf_files(self, model_max_length: int | None = None) -> dict[str, str]:
        """This tokenizer as transformers files (common.hf_files): its own JSON, as a run directory holds it."""
        return hf_files(self._hf.to_str(), model_max_length)

    def same_as(self, other) -> bool:
        return other.kind == self.kind and self._hf.to_str() == other._hf.to_str() and self.eos_id == other.eos_id
