"""The byte tokenizer (the default): UTF-8 bytes are ids 0-255, EOS is 256; nothing to train. The capability tasks
are written in its ids."""

from __future__ import annotations

from typing import Iterable, Literal

from archspec.data.base import TokenizerKind, register
from archspec.data.tokenizer.common import FORMAT
from archspec.train.cache import digest

BYTE_TOKENIZER_VOCAB = 257  # 256 byte values + EOS


@register
class ByteTokenizer(TokenizerKind):
    kind: Literal["byte"] = "byte"  # 256 byte values + specials (EOS)

    reads_corpus = False
    task_ids = True

    def build(self, corpus=None, cache=None) -> "ByteCodec":
        return ByteCodec()

    @classmethod
    def from_state(cls, state: dict, where: str) -> "ByteCodec":
        return ByteCodec()

    def trainability_problems(self, m) -> list[str]:
        if m.vocab_size < BYTE_TOKENIZER_VOCAB:
            return [f"model.vocab_size: must be at least {BYTE_TOKENIZER_VOCAB} for train.data.tokenizer (byte: 256 "
                    f"bytes + EOS), got {m.vocab_size}; raise it (e.g. 320) or train a BPE tokenizer of your own "
                    "vocabulary"]
        return []


class ByteCodec:
    """UTF-8 bytes are ids 0-255; EOS is 256."""

    kind = ByteTokenizer.kind_name()
    vocab_size = BYTE_TOKENIZER_VOCAB
    eos_id = 256
    identity = digest(kind, FORMAT)  # part of every data hash of a byte-tokenised corpus
    vocab_note = "256 bytes + EOS"
    saves_file = False  # nothing to save: every byte tokenizer is this one

    def encode_batch(self, texts: list[str]):
        import numpy as np

        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def state(self) -> dict:
        return {"kind": self.kind, "identity": self.identity}

    def same_as(self, other) -> bool:
        return other.kind == self.kind
