"""Multi-query associative recall (Zoology, Arora et al. 2023), a capability task.

`k1 v1 k2 v2 … kP vP  q1 a1 … qQ aQ  pad…`. Keys are distinct symbols of the first half of `vocab`, values distinct
symbols of the second half; the queries are Q distinct keys of the example in random order, each followed by its
value. Answers: the a_i (predicted at the position of q_i). Chance: 2 / vocab.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.data.base import FIRST_SYMBOL, TaskCorpusKind, register


@register
class MQARCorpus(TaskCorpusKind):
    kind: Literal["mqar"] = "mqar"  # multi-query associative recall (Zoology, Arora et al. 2023)
    vocab: int = Field(64, ge=4, le=252, description="symbols: keys are drawn from the first half, values from the "
                                                     "second (chance accuracy 2/vocab)")
    pairs: int = Field(8, ge=1, le=126, description="key-value pairs at the start of each example (distinct keys)")
    queries: int | None = Field(None, ge=1, le=126, description="keys queried after the pairs, each followed by its "
                                                                "value (the answer); default: pairs (every key once)")
    train_examples: int = Field(20_000, ge=1, le=2_000_000)
    val_examples: int = Field(1_000, ge=1, le=100_000, description="the fixed validation set (its own stream)")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the examples (not the training order: train.seed)")

    probe_help = "associative recall"

    @property
    def n_queries(self) -> int:
        return self.pairs if self.queries is None else self.queries

    def fit_problems(self, seq_len, where, length_name):
        out = []
        half, q = self.vocab // 2, self.n_queries
        if self.pairs > half:
            out.append((where + ("pairs",), f"must be at most vocab // 2 ({half}: keys are distinct symbols of the "
                        f"first half of vocab {self.vocab}), got {self.pairs}", self.pairs))
        if q > self.pairs:
            out.append((where + ("queries",), f"must be at most pairs ({self.pairs}: each query is a distinct key "
                        f"of the example), got {q}", q))
        need = 2 * self.pairs + 2 * q
        if need > seq_len + 1:
            out.append((where + ("pairs",), f"{self.pairs} pairs and {q} queries take {need} tokens, "
                        f"more than a window of {length_name} + 1 = {seq_len + 1}", self.pairs))
        return out

    def fill(self, rng, tokens, answers, seq_len):
        import numpy as np

        count = len(tokens)
        rows = np.arange(count)[:, None]
        half, p, q = self.vocab // 2, self.pairs, self.n_queries
        keys = FIRST_SYMBOL + random_subsets(rng, count, half, p)
        values = FIRST_SYMBOL + half + random_subsets(rng, count, half, p)
        asked = random_subsets(rng, count, p, q)
        tokens[:, 0:2 * p:2], tokens[:, 1:2 * p:2] = keys, values
        tokens[:, 2 * p:2 * p + 2 * q:2] = keys[rows, asked]
        tokens[:, 2 * p + 1:2 * p + 2 * q:2] = values[rows, asked]
        answers[:, 2 * p:2 * p + 2 * q:2] = True  # the target at a query's position is its value
        return np.full(count, -1, dtype=np.int64)

    @property
    def chance(self) -> float:
        return 2.0 / self.vocab

    def describe(self) -> str:
        return f"mqar (vocab {self.vocab}, {self.pairs} pairs, {self.n_queries} queries)"

    @classmethod
    def strategy(cls, bound: int):
        return _drawn(bound) if bound >= 3 else None  # bound: train.seq_len


def _drawn(seq_len: int):
    """An MQAR task that fits a window of seq_len + 1 tokens (fit_problems)."""
    from hypothesis import strategies as st

    @st.composite
    def draw_mqar(draw) -> dict:
        pairs = draw(st.integers(1, min(126, (seq_len - 1) // 2)))
        queries = draw(st.integers(1, min(pairs, (seq_len + 1 - 2 * pairs) // 2)))
        out = {"vocab": draw(st.integers(max(4, 2 * pairs), 252)), "pairs": pairs,
               "train_examples": draw(st.integers(1, 64)), "val_examples": draw(st.integers(1, 64))}
        if queries != pairs or draw(st.booleans()):  # omitted: every key once
            out["queries"] = queries
        return out

    return draw_mqar()


def random_subsets(rng, n: int, population: int, size: int):
    """(n, size) distinct draws from range(population) per row, in random order (a numpy Generator's draws)."""
    import numpy as np

    return np.argsort(rng.random((n, population)), axis=1)[:, :size]
