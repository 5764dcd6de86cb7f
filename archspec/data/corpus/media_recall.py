"""media_recall: key/value pairs that only the media holds, asked for in the text (issue 46's capability task).

Each example has one media item of `pairs` tokens; token j encodes a pair, key_code[k_j] + value_code[v_j] (+ a
little noise), with fixed random codebooks drawn from `seed` (the "encoder"), the pairs in a random order. The text
is the item's marker, then each key of the item (in another random order) followed by its value:

    MEDIA_MARK k3 v3 k1 v1 k4 v4 k2 v2 pad…

The answers are the values, predicted at their key's position. Keys are distinct within an item, values drawn with
replacement and each asked once: nothing in the text tells a value, so a model that reads the text only scores
chance, 1 / values; a model that reads the media can look the key up. A model with media input
(model.media) reads its own marker id where MEDIA_MARK stands (archspec.train.tasks.Examples.batch); a text-only
model reads the text as it is (MEDIA_MARK is an ordinary id to it), so the comparison is one spec change.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.data.base import FIRST_SYMBOL, MEDIA_MARK, PAD, TaskCorpusKind, register
from archspec.data.corpus.mqar import random_subsets


@register
class MediaRecallCorpus(TaskCorpusKind):
    kind: Literal["media_recall"] = "media_recall"  # key/value pairs held only in a media item, asked in the text
    pairs: int = Field(4, ge=1, le=64, description="key/value pairs per example: the item's media tokens")
    keys: int = Field(16, ge=1, le=248, description="key symbols (distinct within an example)")
    values: int = Field(16, ge=2, le=248, description="value symbols (chance accuracy 1/values)")
    width: int = Field(32, ge=1, le=4096, description="the media features' width (must be model.media.width)")
    noise: float = Field(0.1, ge=0.0, le=10.0, description="standard deviation of the noise added to each media token")
    train_examples: int = Field(20_000, ge=1, le=2_000_000)
    val_examples: int = Field(1_000, ge=1, le=100_000, description="the fixed validation set (its own stream)")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the codebooks and the examples (not the training "
                                                         "order: train.seed)")

    probe_help = "recall of key/value pairs held only in the media (a text-only model scores chance)"

    def fit_problems(self, seq_len, where, length_name):
        out = []
        if self.pairs > self.keys:
            out.append((where + ("pairs",), f"must be at most keys ({self.keys}: the keys of an example are distinct), "
                        f"got {self.pairs}", self.pairs))
        if FIRST_SYMBOL + self.keys + self.values > 256:
            out.append((where + ("values",), f"keys + values must be at most {256 - FIRST_SYMBOL} (byte ids from "
                        f"{FIRST_SYMBOL}), got {self.keys} + {self.values}", self.values))
        if 1 + 2 * self.pairs > seq_len + 1:
            out.append((where + ("pairs",), f"the marker and {self.pairs} pairs take {1 + 2 * self.pairs} tokens, more "
                        f"than a window of {length_name} + 1 = {seq_len + 1}", self.pairs))
        return out

    def model_problems(self, m):
        out, media = [], m.media
        if media is None:  # a text-only model reads the text only: it can take part, at chance
            return out
        if media.width != self.width:
            out.append((("model", "media", "width"), f"the {self.kind} task's media are {self.width} wide "
                        f"(the task's width), got {media.width}", media.width))
        if media.resampler is None and media.tokens != self.pairs:
            out.append((("model", "media", "tokens"), f"the {self.kind} task's items hold {self.pairs} tokens "
                        f"(the task's pairs) and the model has no resampler: must be {self.pairs}, got "
                        f"{media.tokens}", media.tokens))
        if media.resampler is not None and media.resampler.max_input_tokens < self.pairs:
            out.append((("model", "media", "resampler", "max_input_tokens"), f"the {self.kind} task's items hold "
                        f"{self.pairs} tokens (the task's pairs), more than the resampler takes, "
                        f"{media.resampler.max_input_tokens}", media.resampler.max_input_tokens))
        last = FIRST_SYMBOL + self.keys + self.values - 1
        if media.marker_id == PAD or FIRST_SYMBOL <= media.marker_id <= last:
            out.append((("model", "media", "marker_id"), f"{media.marker_id} is an id the {self.kind} task's text uses "
                        f"({PAD} and {FIRST_SYMBOL} to {last}); use "
                        f"{MEDIA_MARK} or an id above {last}", media.marker_id))
        return out

    def codebooks(self):
        """(key codes (keys, width), value codes (values, width)), float32, from `seed` alone."""
        import numpy as np

        rng = np.random.default_rng([self.seed, 0x6D65646961])  # the codebooks' own stream ("media")
        return (rng.standard_normal((self.keys, self.width)).astype(np.float32),
                rng.standard_normal((self.values, self.width)).astype(np.float32))

    def fill(self, rng, tokens, answers, seq_len):
        import numpy as np

        count, p = len(tokens), self.pairs
        keys = random_subsets(rng, count, self.keys, p)  # distinct per example, in the text's order
        values = rng.integers(0, self.values, (count, p))
        tokens[:, 0] = MEDIA_MARK
        tokens[:, 1:2 * p + 1:2] = FIRST_SYMBOL + keys
        tokens[:, 2:2 * p + 2:2] = FIRST_SYMBOL + self.keys + values
        answers[:, 1:2 * p + 1:2] = True  # the target at a key's position is its value
        return np.full(count, -1, dtype=np.int64)

    def media(self, rng, tokens):
        """Each example's one item: its pairs (read back from the text), in another random order, encoded."""
        import numpy as np

        count, p = len(tokens), self.pairs
        keys = tokens[:, 1:2 * p + 1:2].astype(np.int64) - FIRST_SYMBOL
        values = tokens[:, 2:2 * p + 2:2].astype(np.int64) - FIRST_SYMBOL - self.keys
        order = np.argsort(rng.random((count, p)), axis=1)  # the media's order of the pairs
        rows = np.arange(count)[:, None]
        key_code, value_code = self.codebooks()
        media = key_code[keys[rows, order]] + value_code[values[rows, order]]  # (n, pairs, width)
        media += self.noise * rng.standard_normal(media.shape).astype(np.float32)
        return media[:, None].astype(np.float32)  # (n, 1 item, pairs, width)

    @property
    def chance(self) -> float:
        return 1.0 / self.values

    def describe(self) -> str:
        return (f"media_recall ({self.pairs} pairs, {self.keys} keys, {self.values} values, media width "
                f"{self.width})")

    @classmethod
    def strategy(cls, bound: int):
        if bound < 2:  # bound: train.seq_len; the marker and one pair need 3 tokens
            return None
        from hypothesis import strategies as st

        from archspec.kinds.introspect import bounds

        values_le = bounds(cls.model_fields["values"])["le"]  # the field's bound and the byte ids' (keys + values)

        @st.composite
        def draw_media_recall(draw) -> dict:
            pairs = draw(st.integers(1, min(64, bound // 2)))
            keys = draw(st.integers(pairs, 124))
            return {"pairs": pairs, "keys": keys, "values": draw(st.integers(2, min(values_le, 252 - keys))),
                    "width": draw(st.integers(1, 16)), "train_examples": draw(st.integers(1, 64)),
                    "val_examples": draw(st.integers(1, 64))}

        return draw_media_recall()
