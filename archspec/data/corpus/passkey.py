"""Passkey retrieval (Mohtashami & Jaggi 2023), a capability task.

`filler… MARK p1…pk filler… QUESTION p1…pk`. The question stands at the end of the window; the passkey's first token
is exactly `d` tokens before the question (d drawn from `distances` per example), so a query sees it through one
sliding-window layer only when d < window. Passkey symbols and filler symbols are disjoint. Answers: the k passkey
tokens after the question. Chance: 1 / vocab. Accuracy is also reported per distance (the buckets).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.data.base import FIRST_SYMBOL, KEY_MARK, QUESTION, TaskCorpusKind, register


@register
class PasskeyCorpus(TaskCorpusKind):
    kind: Literal["passkey"] = "passkey"  # a passkey inside filler, asked for at the end (Mohtashami & Jaggi 2023)
    vocab: int = Field(16, ge=2, le=250, description="passkey symbols (chance accuracy 1/vocab)")
    key_len: int = Field(1, ge=1, le=16, description="tokens per passkey")
    distances: list[int] = Field(default_factory=lambda: [16, 32, 64], min_length=1, max_length=64,
                                 description="tokens from the passkey to the question; each example takes one, and "
                                             "accuracy is also reported per distance")
    filler: int = Field(64, ge=1, le=248, description="filler symbols (drawn at random around the passkey)")
    train_examples: int = Field(20_000, ge=1, le=2_000_000)
    val_examples: int = Field(1_000, ge=1, le=100_000, description="the fixed validation set (its own stream)")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the examples (not the training order: train.seed)")

    probe_help = "retrieval"

    def fit_problems(self, seq_len, where, length_name):
        out = []
        if self.vocab + self.filler > 256 - FIRST_SYMBOL:
            out.append((where + ("filler",), f"vocab + filler must be at most {256 - FIRST_SYMBOL} (byte ids from "
                        f"{FIRST_SYMBOL}), got {self.vocab} + {self.filler}", self.filler))
        k = self.key_len
        longest = seq_len - k - 1  # the marker before the passkey must fit at position 0
        for i, d in enumerate(self.distances):
            if d < k or d > longest:
                why = (f"a passkey of {k} token{'s' * (k > 1)} ends before the question only at a distance of at least "
                       f"{k}" if d < k else f"with {length_name} = {seq_len} and key_len {k} the longest distance is "
                       f"{longest}")
                out.append((where + ("distances", i), f"impossible distance {d}: {why}", d))
        if len(set(self.distances)) != len(self.distances):
            out.append((where + ("distances",), "distances must be distinct (each is its own accuracy bucket)",
                        self.distances))
        return out

    def fill(self, rng, tokens, answers, seq_len):
        import numpy as np

        count, length = tokens.shape
        rows = np.arange(count)[:, None]
        k = self.key_len
        distances = np.asarray(self.distances, dtype=np.int64)[rng.integers(0, len(self.distances), count)]
        tokens[:] = FIRST_SYMBOL + self.vocab + rng.integers(0, self.filler, (count, length))
        key = FIRST_SYMBOL + rng.integers(0, self.vocab, (count, k))
        question = seq_len - k  # the question's position: the passkey follows it and ends the window
        start = question - distances  # the passkey's first token
        tokens[np.arange(count), start - 1] = KEY_MARK
        tokens[rows, start[:, None] + np.arange(k)] = key
        tokens[:, question] = QUESTION
        tokens[:, question + 1:] = key
        answers[:, question:question + k] = True
        return distances

    def buckets(self) -> list[int]:
        return sorted(self.distances)

    @property
    def chance(self) -> float:
        return 1.0 / self.vocab

    def describe(self) -> str:
        return (f"passkey (vocab {self.vocab}, key_len {self.key_len}, distances "
                f"{', '.join(map(str, self.distances))}, filler {self.filler})")

    @classmethod
    def strategy(cls, bound: int):
        return _drawn(bound) if bound >= 3 else None  # bound: train.seq_len


def _drawn(seq_len: int):
    """A passkey task that fits a window of seq_len + 1 tokens (fit_problems)."""
    from hypothesis import strategies as st

    from archspec.kinds.introspect import bounds

    @st.composite
    def draw_passkey(draw) -> dict:
        key_len = draw(st.integers(1, min(16, (seq_len - 1) // 2)))
        vocab = draw(st.integers(2, 250))
        filler_le = bounds(PasskeyCorpus.model_fields["filler"])["le"]  # the field's bound and the byte ids' (fit)
        return {"vocab": vocab, "key_len": key_len, "filler": draw(st.integers(1, min(filler_le, 252 - vocab))),
                "distances": draw(st.lists(st.integers(key_len, seq_len - key_len - 1), min_size=1, max_size=8,
                                           unique=True)),
                "train_examples": draw(st.integers(1, 64)), "val_examples": draw(st.integers(1, 64))}

    return draw_passkey()
