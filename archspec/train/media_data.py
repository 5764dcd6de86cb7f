"""Training data of a media corpus (archspec.data.corpus.media): text windows that carry their media items.

    data = media_data(spec, cache_dir())
    x, y, media = data.sampler.next_batch()   # (B, T), (B, T), (B, max_items, tokens, width); a text-only model: x, y

Each document's ids (a marker token where each item sits, EOS after it) are packed into one stream per split, as a
text corpus's are (archspec.train.data: windows of seq_len + 1 tokens every seq_len tokens, the same sampler, the same
validation windows), and the k-th marker of a split's stream names the k-th item of its media, in order.

The rule of a window. Its media are the items whose markers lie among its inputs (positions 0 to T - 1), in order,
then zero items up to model.media.max_items (no marker names them, so no token sees them: one shape for every batch).
Each token sees the item of the last marker at or before it (archspec.runtime.media_items), so:
- a token whose item's marker fell in an earlier window sees no item: it is read as text whose context the window's
  start cut off (the item cannot be carried over: which item a token sees is computed from the tokens alone);
- a marker at the window's last target (position T) is not an input: its item belongs to the next window;
- a marker is an input only, never a target (its target is -100), as in OpenFlamingo: where an item sits is given,
  not predicted; a text-only model, which reads no markers, is then trained on the same text tokens;
- no window may hold more markers than model.media.max_items: refused when the data is built, naming the field.

A text-only model (no model.media) reads the same documents without their markers and without media (batches of
(x, y)), so text-only against cross-attention is one spec change. Splits: documents by the hash of their text as a
text corpus's (archspec.train.data), or, when that leaves a side empty, the stream's last tokens. The data hash is
the corpus's (its texts and its media's bytes), the tokenizer's identity, the split and the marker (or none); the
media are held in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from archspec.cache import digest
from archspec.errors import UserError
from archspec.train.data import _is_val_document, check_vocab, val_windows, window_count
from archspec.train.sampling import EpochSampler
from archspec.train.tokenizer import build_tokenizer

_FORMAT = 1  # bump when the layout of the streams or the split rule changes
IGNORE = -100


@dataclass
class MediaStream:
    """One split: its tokens, the positions of its marker tokens (sorted), and the item each names, in order."""

    tokens: np.ndarray  # (n,) int64
    markers: np.ndarray  # (items,) int64: positions in `tokens`
    items: torch.Tensor | None  # (items, tokens per item, width) float32; None for a text-only model

    def window_items(self, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """For windows starting at `starts`: the index of the first item whose marker is among the inputs, and how
        many are."""
        lo = np.searchsorted(self.markers, starts, side="left")
        hi = np.searchsorted(self.markers, starts + seq_len, side="left")
        return lo, hi - lo


def window_batch(stream: MediaStream, windows: np.ndarray, seq_len: int, marker_id: int | None, max_items: int
                 ) -> tuple[torch.Tensor, ...]:
    """Windows → (inputs (B, T), targets (B, T)) and, for a model with media input, the media (B, max_items,
    tokens, width): window b's items in the order of its markers, then zero items (the module's rule)."""
    rows = np.stack([stream.tokens[w * seq_len: w * seq_len + seq_len + 1] for w in windows])
    batch = torch.from_numpy(rows)  # (B, T + 1)
    inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:].clone()
    if marker_id is None or stream.items is None:
        return inputs, targets
    targets[targets == marker_id] = IGNORE  # a marker is an input, never a target
    lo, count = stream.window_items(np.asarray(windows, dtype=np.int64) * seq_len, seq_len)
    media = torch.zeros(len(windows), max_items, *stream.items.shape[1:])  # (B, max_items, tokens, width)
    for b, (first, n) in enumerate(zip(lo.tolist(), count.tolist())):
        media[b, :n] = stream.items[first: first + n]
    return inputs, targets, media


class MediaWindowSampler(EpochSampler):
    """Training windows of a media stream, in the order of archspec.train.sampling."""

    def __init__(self, stream: MediaStream, seq_len: int, batch_size: int, seed: int, rank: int, world: int,
                 marker_id: int | None, max_items: int):
        super().__init__(batch_size, seed, rank, world)
        self.stream, self.seq_len, self.marker_id, self.max_items = stream, seq_len, marker_id, max_items
        self.n_windows = window_count(len(stream.tokens), seq_len)
        if self.n_windows == 0:
            raise UserError(f"the training split holds {len(stream.tokens)} tokens, fewer than one window of "
                            f"train.seq_len + 1 = {seq_len + 1}; use a larger corpus or a shorter train.seq_len")

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        return window_batch(self.stream, self.my_items(), self.seq_len, self.marker_id, self.max_items)


class MediaData:
    """What the loop reads from `TrainData` (sampler, val_batches, tokenizer, data_hash, describe), for a media
    corpus."""

    def __init__(self, corpus, tokenizer, train: MediaStream, val: MediaStream, data_hash: str, n_documents: int,
                 split: str, spec, rank: int, world: int):
        t, media = spec.train, spec.model.media
        self.corpus, self.tokenizer, self.train, self.val = corpus, tokenizer, train, val
        self._hash, self.n_documents, self.split = data_hash, n_documents, split
        marker = media.marker_id if media is not None else None
        max_items = media.max_items if media is not None else 0
        self.sampler = MediaWindowSampler(train, t.seq_len, t.batch_size, t.seed, rank, world, marker, max_items)
        windows = val_windows(len(val.tokens), t.seq_len, t.eval_size, rank, world)
        self.val_batches = [window_batch(val, windows[i: i + t.batch_size], t.seq_len, marker, max_items)
                            for i in range(0, len(windows), t.batch_size)]

    @property
    def data_hash(self) -> str:
        return self._hash

    def describe(self) -> dict:
        return {"corpus": self.corpus.description, "corpus_hash": self.corpus.content_hash,
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size,
                "train_tokens": len(self.train.tokens), "val_tokens": len(self.val.tokens),
                "documents": self.n_documents, "split": self.split, "data_hash": self.data_hash,
                "media_items": len(self.train.markers) + len(self.val.markers)}


def media_stream(docs: list[tuple[list[int], torch.Tensor | None]], eos: int, marker_id: int | None) -> MediaStream:
    ids = [np.asarray(i + [eos], dtype=np.int64) for i, _ in docs]
    tokens = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
    markers = np.flatnonzero(tokens == marker_id) if marker_id is not None else np.empty(0, dtype=np.int64)
    media = [m for _, m in docs if m is not None]
    return MediaStream(tokens, markers, torch.cat(media) if media else None)


def split_stream(stream: MediaStream, at: int) -> tuple[MediaStream, MediaStream]:
    """The stream split at token `at`: each item goes with its marker."""
    k = int(np.searchsorted(stream.markers, at))
    items = stream.items
    return (MediaStream(stream.tokens[:at], stream.markers[:k], None if items is None else items[:k]),
            MediaStream(stream.tokens[at:], stream.markers[k:] - at, None if items is None else items[k:]))


def _check_windows(stream: MediaStream, seq_len: int, max_items: int, split: str) -> None:
    """No window of the split holds more markers among its inputs than the model takes items."""
    n = window_count(len(stream.tokens), seq_len)
    if n == 0 or len(stream.markers) == 0:
        return
    _, count = stream.window_items(np.arange(n, dtype=np.int64) * seq_len, seq_len)
    most = int(count.max())
    if most > max_items:
        raise UserError(f"model.media.max_items: a window of train.seq_len {seq_len} tokens of this corpus's {split} "
                        f"split holds {most} markers (items); the model takes {max_items}: raise max_items to "
                        f"{most} or shorten train.seq_len")


def media_data(spec, cache, *, rank: int = 0, world: int = 1) -> MediaData:
    t, m = spec.train, spec.model
    corpus = t.data.corpus.open()
    tokenizer = build_tokenizer(t.data.tokenizer, corpus, cache)
    check_vocab(tokenizer, m.vocab_size)
    marker = m.media.marker_id if m.media is not None else None
    if marker is not None and marker < tokenizer.vocab_size:
        raise UserError(f"model.media.marker_id: {marker} is one of the {tokenizer.kind} tokenizer's ids (0 to "
                        f"{tokenizer.vocab_size - 1}); the marker needs an id of its own, at least "
                        f"{tokenizer.vocab_size}")

    def encode(text: str) -> list[int]:
        return tokenizer.encode_batch([text])[0].tolist() if text else []

    examples = corpus.examples(encode, m)
    if examples and m.media is not None:
        counts = sorted({media.size(1) for _, media in examples})
        if len(counts) > 1:
            raise UserError(f"train.data.corpus.path: its items hold {counts} tokens each; one batch holds one "
                            "count: give every item of the corpus the same number of tokens")
    texts = list(corpus.documents())
    sides = [_is_val_document(text, t.data.val_fraction) for text in texts]
    if all(sides) or not any(sides):  # too few documents to split by document: the stream's last tokens
        whole = media_stream(examples, tokenizer.eos_id, marker)
        n_val = max(1, math.ceil(len(whole.tokens) * t.data.val_fraction))
        train, val = split_stream(whole, len(whole.tokens) - n_val)
        split = "tokens"
    else:
        train = media_stream([e for e, v in zip(examples, sides) if not v], tokenizer.eos_id, marker)
        val = media_stream([e for e, v in zip(examples, sides) if v], tokenizer.eos_id, marker)
        split = "documents"
    if m.media is not None:
        for name, stream in (("training", train), ("validation", val)):
            _check_windows(stream, t.seq_len, m.media.max_items, name)
    data_hash = digest("media", _FORMAT, corpus.content_hash, tokenizer.identity, t.data.val_fraction, marker)
    return MediaData(corpus, tokenizer, train, val, data_hash, len(examples), split, spec, rank, world)
