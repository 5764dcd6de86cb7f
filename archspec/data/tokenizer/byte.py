"""The byte tokenizer (the default): UTF-8 bytes are ids 0-255, EOS is 256; nothing to train. The capability tasks
are written in its ids."""

from __future__ import annotations

from typing import Iterable, Literal

from archspec.data.base import TokenizerKind, register
from archspec.data.tokenizer.common import EOS_TEXT, FORMAT, hf_files
from archspec.cache import digest

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

    def hf_files(self, model_max_length: int | None = None) -> dict[str, str]:
        """This tokenizer as transformers files (common.hf_files): an HF `tokenizers` BPE with no merges whose 256
        tokens are the bytes, each byte's token at the byte's own id, and EOS_TEXT as the special token 256. HF's
        byte-level pre-tokenizer writes each byte of the UTF-8 text as one character of GPT-2's byte alphabet
        (`_byte_chars`; no regex split, no prefix space) and its decoder maps them back (invalid UTF-8 becomes
        U+FFFD, as in `decode`), so encode(text) is exactly `encode_batch([text])[0]` and decoding drops EOS and
        every id past 256 (a padded model vocabulary's unused ids have no token)."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        chars = _byte_chars()
        hf = HFTokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([AddedToken(EOS_TEXT, special=True, normalized=False)])
        assert hf.token_to_id(EOS_TEXT) == self.eos_id and hf.get_vocab_size() == self.vocab_size
        return hf_files(hf.to_str(), model_max_length)

    def same_as(self, other) -> bool:
        return other.kind == self.kind


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte (the alphabet of HF's ByteLevel pre-tokenizer): the printable
    Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    own = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [""] * 256, 0
    for b in range(256):
        if b in own:
            chars[b] = chr(b)
        else:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars
