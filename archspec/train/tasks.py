"""Capability tasks as corpora: multi-query associative recall (MQAR), passkey retrieval, media recall.

    data = task_data(spec)                        # when spec.train.data.corpus is a task (TaskCorpusKind)
    x, y = data.sampler.next_batch()              # (B, T) inputs; targets are -100 except at the answer positions
                                                  # (a media task, for a model with media input: x, y, media)
    scorer = Scorer(); scorer.add(logits, y, buckets); scorer.metrics()  # {"probe.accuracy": ..., ...}

Each example is one window of `seq_len + 1` tokens written in the byte tokenizer's ids (so checkpoints, `sample` and
the tokenizer that travels with a run need nothing new), generated from the corpus's own `seed` with numpy: the same
parameters give the same examples on every machine, and every training seed of a sweep sees the same data (the
order follows train.seed). The targets of every position but the answers are -100, so the loss, the validation loss
and the accuracy are all over the answer positions only.

Ids: 0 pad, 1 the passkey marker, 2 the question marker, 3 a media item's place, symbols from 4 (archspec.data.base).
Each task is a unit of archspec.data (archspec/data/corpus/mqar.py, passkey.py, media_recall.py): its layout, its
rules, its accuracy buckets, its chance and (a media task) its media live there; this module holds what every task shares (examples, scorer, samplers, the data hash).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from archspec.data.base import (
    FIRST_SYMBOL,
    KEY_MARK,
    MEDIA_MARK,
    PAD,
    QUESTION,
    TaskCorpusKind,
    task_kinds,
    task_tokenizer,
)
from archspec.errors import UserError
from archspec.cache import digest
from archspec.train.sampling import EpochSampler

_FORMAT = 1  # bump when the layout of examples for the same parameters changes
__all__ = ["FIRST_SYMBOL", "KEY_MARK", "MEDIA_MARK", "PAD", "QUESTION", "IGNORE", "Examples", "Scorer", "TaskData",
           "check_task", "generate", "task_problems", "task_scorer", "describe_task", "task_hash", "task_data", "task_kinds"]
IGNORE = -100  # the generated model's ignore_index
METRIC_PREFIX = "probe."  # training-time metrics: metrics.probe.accuracy, metrics.probe.accuracy.d<distance>

TaskCorpus = TaskCorpusKind
Problem = tuple[tuple, str, Any]  # (field path, message, value), as archspec.spec.rules reports them


# ── rules: does this task fit a window of seq_len + 1 tokens ────────────────────────────────────────────────────────


def task_problems(corpus: TaskCorpus, seq_len: int, where: tuple = ("train", "data", "corpus"),
                  length_name: str = "train.seq_len") -> list[Problem]:
    """Why `corpus` cannot be written in windows of `seq_len + 1` tokens (empty: it can)."""
    return corpus.fit_problems(seq_len, where, length_name)


def check_task(corpus: TaskCorpus, seq_len: int, where: tuple = ("train", "data", "corpus"),
               length_name: str = "train.seq_len") -> None:
    problems = task_problems(corpus, seq_len, where, length_name)
    if problems:
        raise UserError(f"the {corpus.kind} task does not fit",
                        [f"{'.'.join(str(p) for p in path)}: {message}" for path, message, _ in problems])


# ── examples ─────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Examples:
    tokens: np.ndarray  # (n, seq_len + 1) uint8 byte ids: inputs are [:, :-1], next tokens [:, 1:]
    answers: np.ndarray  # (n, seq_len) bool: the target positions that are answers
    buckets: np.ndarray  # (n,) int64: the passkey distance of each example; -1 for MQAR
    media: np.ndarray | None = None  # (n, items, tokens, width) float32: a media task's items (TaskCorpusKind.media)

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, index: np.ndarray, marker_id: int | None = None) -> tuple[torch.Tensor, ...]:
        """(inputs (B, T), targets (B, T)); with `marker_id` (a model with media input: its model.media.marker_id)
        and a media task, also the media (B, items, tokens, width), and the inputs hold `marker_id` where each item
        sits (MEDIA_MARK in the examples). Without: the text alone, as a text-only model reads it."""
        tokens = torch.from_numpy(self.tokens[index].astype(np.int64))
        targets = tokens[:, 1:].clone()
        targets[~torch.from_numpy(self.answers[index])] = IGNORE
        inputs = tokens[:, :-1].contiguous()
        if marker_id is None or self.media is None:
            return inputs, targets
        inputs = inputs.masked_fill(inputs == MEDIA_MARK, marker_id)
        return inputs, targets, torch.from_numpy(self.media[index])


_SPLITS = {"train": 0, "val": 1}


def generate(corpus: TaskCorpus, seq_len: int, split: str, n: int | None = None) -> Examples:
    """The `split` ("train" or "val") examples of `corpus` in windows of seq_len + 1 tokens; the first `n` of them
    (default: the corpus's own count for that split). Deterministic in (parameters, seq_len, split)."""
    check_task(corpus, seq_len)
    count = n if n is not None else (corpus.train_examples if split == "train" else corpus.val_examples)
    rng = np.random.default_rng([corpus.seed, _SPLITS[split], _FORMAT])
    length = seq_len + 1
    tokens = np.zeros((count, length), dtype=np.uint8)
    answers = np.zeros((count, seq_len), dtype=bool)
    buckets = corpus.fill(rng, tokens, answers, seq_len)
    return Examples(tokens, answers, buckets, corpus.media(rng, tokens))  # a text task draws nothing more


# ── scoring: exact match on the answer positions ─────────────────────────────────────────────────────────────────


@dataclass
class Scorer:
    """Counts of answer positions and correct argmax predictions, overall and per bucket (passkey distance)."""

    correct: int = 0
    total: int = 0
    by_bucket: dict[int, list[int]] = field(default_factory=dict)  # bucket → [correct, total]

    def add(self, logits: torch.Tensor, targets: torch.Tensor, buckets: torch.Tensor | None = None) -> None:
        answer = targets != IGNORE  # (B, T)
        hit = (logits.argmax(-1) == targets) & answer
        self.correct += int(hit.sum())
        self.total += int(answer.sum())
        if buckets is not None:
            for b in torch.unique(buckets).tolist():
                if b < 0:
                    continue
                rows = buckets == b
                entry = self.by_bucket.setdefault(int(b), [0, 0])
                entry[0] += int(hit[rows].sum())
                entry[1] += int(answer[rows].sum())

    def counts(self) -> list[int]:
        """Flat counts (for summing over processes): correct, total, then per bucket in order."""
        return [self.correct, self.total, *(c for b in sorted(self.by_bucket) for c in self.by_bucket[b])]

    def metrics(self, counts: list[int] | None = None, prefix: str = METRIC_PREFIX) -> dict[str, float]:
        """`accuracy` (over every answer position) and `accuracy.d<bucket>`, under `prefix`."""
        c = list(counts if counts is not None else self.counts())
        out = {f"{prefix}accuracy": c[0] / c[1] if c[1] else float("nan")}
        for i, b in enumerate(sorted(self.by_bucket)):
            right, total = c[2 + 2 * i], c[3 + 2 * i]
            out[f"{prefix}accuracy.d{b}"] = right / total if total else float("nan")
        return out


def task_scorer(corpus: TaskCorpus) -> Scorer:
    """A scorer with every bucket of the task present from the start, so counts from several processes line up."""
    return Scorer(by_bucket={int(d): [0, 0] for d in corpus.buckets()})


# ── everything a run needs (the interface of archspec.train.data.TrainData) ──────────────────────────────────────


class ExampleSampler(EpochSampler):
    """Whole examples, in the order of archspec.train.sampling (each example is one window)."""

    def __init__(self, examples: Examples, batch_size: int, seed: int, rank: int = 0, world: int = 1,
                 marker_id: int | None = None):
        super().__init__(batch_size, seed, rank, world)
        self.examples, self.marker_id = examples, marker_id
        self.n_examples = self.n_windows = len(examples)
        self.seq_len = examples.tokens.shape[1] - 1

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        return self.examples.batch(self.my_items(), self.marker_id)


def describe_task(corpus: TaskCorpus) -> str:
    return corpus.describe()


def val_batches(examples: Examples, batch_size: int, rank: int = 0, world: int = 1, marker_id: int | None = None
                ) -> tuple[list[tuple[torch.Tensor, ...]], list[torch.Tensor]]:
    """Every example once, rank r taking every world-th; with each batch, its examples' buckets."""
    mine = np.arange(len(examples))[rank::world]
    batches, buckets = [], []
    for i in range(0, len(mine), batch_size):
        index = mine[i: i + batch_size]
        batches.append(examples.batch(index, marker_id))
        buckets.append(torch.from_numpy(examples.buckets[index]))
    return batches, buckets


class TaskData:
    """A task's training data: what the loop reads from `TrainData` (sampler, val_batches, tokenizer, data_hash,
    describe), plus `val_buckets` and `scorer()` for the accuracy on the answer positions."""

    def __init__(self, corpus: TaskCorpus, seq_len: int, batch_size: int, seed: int, rank: int = 0, world: int = 1,
                 marker_id: int | None = None):
        """marker_id: a model with media input's model.media.marker_id (its batches then carry a media task's
        media); None: a text-only model, which reads the text only."""
        self.corpus, self.seq_len = corpus, seq_len
        self.tokenizer = task_tokenizer()().build(None, None)  # the ids the examples are written in
        self.train = generate(corpus, seq_len, "train")
        self.val = generate(corpus, seq_len, "val")
        self.sampler = ExampleSampler(self.train, batch_size, seed, rank, world, marker_id)
        self.val_batches, self.val_buckets = val_batches(self.val, batch_size, rank, world, marker_id)

    @property
    def data_hash(self) -> str:
        """Names the examples: the task's parameters and the window length (tokenizer and layout by _FORMAT)."""
        return task_hash(self.corpus, self.seq_len)

    def scorer(self) -> Scorer:
        return task_scorer(self.corpus)

    def describe(self) -> dict:
        return {"corpus": describe_task(self.corpus), "corpus_hash": self.data_hash, "tokenizer": self.tokenizer.kind,
                "vocab_size": self.tokenizer.vocab_size, "train_tokens": int(self.train.tokens[:, 1:].size),
                "val_tokens": int(self.val.tokens[:, 1:].size), "documents": len(self.train), "split": "examples",
                "data_hash": self.data_hash}


def task_hash(corpus: TaskCorpus, seq_len: int) -> str:
    return digest("task", _FORMAT, corpus.model_dump(mode="json"), seq_len)


def task_data(spec, *, rank: int = 0, world: int = 1) -> TaskData:
    t, media = spec.train, spec.model.media
    return TaskData(t.data.corpus, t.seq_len, t.batch_size, t.seed, rank, world,
                    media.marker_id if media is not None else None)
