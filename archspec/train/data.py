"""Training data: corpus → tokenizer → token file (once, cached) → shuffled windows of seq_len + 1 tokens.

    data = build_data(spec, cache_dir(), rank=0, world=1)
    x, y = data.sampler.next_batch()          # (B, T) inputs and the same windows shifted by one
    data.val_batches                          # a fixed list of (x, y), the same for every run on this data

The corpus is tokenised once into two memory-mapped files (train, val) of uint16 ids (uint32 above 65536 ids) with
EOS after every document, named by the hash of (corpus content, tokenizer, split), so every later run, every rank and
every machine with the same data reads the same tokens and records the same data hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from archspec.data.base import CorpusKind, Tokenizer, task_tokenizer
from archspec.data.base import TextSource as Corpus
from archspec.errors import UserError
from archspec.spec.train import DataSpec
from archspec.cache import atomic_write_text, digest, writing_cache
from archspec.train.sampling import EpochSampler
from archspec.train.tokenizer import build_tokenizer

_FORMAT = 1  # bump when the token files' layout or the split rule changes
_ENCODE_CHUNK_CHARS = 8 << 20  # documents are tokenised in batches of about this much text


# ── corpora: each kind is a unit of archspec.data (archspec/data/corpus/) ─────────────────────────────────────────


def open_corpus(spec: CorpusKind) -> Corpus:
    """The corpus's documents (a task corpus refuses: its examples are generated as token ids, archspec.train.tasks)."""
    return spec.open()


# ── the token store ──────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class TokenStore:
    """The tokenised corpus: `train` and `val` are read-only memory-mapped arrays of ids."""

    directory: Path
    train: np.ndarray
    val: np.ndarray
    meta: dict

    @property
    def key(self) -> str:
        return self.meta["key"]


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def _is_val_document(text: str, val_fraction: float) -> bool:
    """Split by document content: stable under reordering, and duplicate documents land on the same side."""
    h = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "little") < val_fraction * 2.0**64


def _batched_documents(corpus: Corpus) -> Iterator[list[str]]:
    batch, size = [], 0
    for doc in corpus.documents():
        batch.append(doc)
        size += len(doc)
        if size >= _ENCODE_CHUNK_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write_token_files(corpus: Corpus, tokenizer: Tokenizer, val_fraction: float, out: Path) -> dict:
    """Tokenise every document, EOS after each, into out/train.bin and out/val.bin; return the counts."""
    dtype = _token_dtype(tokenizer.vocab_size)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    counts = {"train": 0, "val": 0, "documents": 0}
    with open(out / "train.bin", "wb") as f_train, open(out / "val.bin", "wb") as f_val:
        for docs in _batched_documents(corpus):
            for doc, ids in zip(docs, tokenizer.encode_batch(docs)):
                side = "val" if _is_val_document(doc, val_fraction) else "train"
                ids = np.concatenate([ids.astype(dtype, copy=False), eos])
                (f_val if side == "val" else f_train).write(ids.tobytes())
                counts[side] += len(ids)
                counts["documents"] += 1
    counts["split"] = "documents"
    if counts["train"] == 0 or counts["val"] == 0:  # too few documents to split by document: split the token stream
        counts.update(_split_by_tokens(out, dtype, val_fraction))
    return counts


def _split_by_tokens(out: Path, dtype: np.dtype, val_fraction: float) -> dict:
    tokens = np.concatenate([np.fromfile(out / "train.bin", dtype=dtype), np.fromfile(out / "val.bin", dtype=dtype)])
    n_val = max(1, math.ceil(len(tokens) * val_fraction))
    tokens[:-n_val].tofile(out / "train.bin")
    tokens[-n_val:].tofile(out / "val.bin")
    return {"train": len(tokens) - n_val, "val": n_val, "split": "tokens"}


def _open_tokens(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype=dtype)
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if len(tokens) != count:
        raise ValueError(f"{path}: {len(tokens)} tokens, meta.json says {count}")
    return tokens


def _open_store(directory: Path) -> TokenStore:
    meta = json.loads((directory / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    train = _open_tokens(directory / "train.bin", dtype, meta["n_train"])
    val = _open_tokens(directory / "val.bin", dtype, meta["n_val"])
    return TokenStore(directory, train, val, meta)


def token_store(corpus: Corpus, tokenizer: Tokenizer, val_fraction: float, cache: Path) -> TokenStore:
    """The tokenised corpus, built on first use and then read from `cache/tokens/<key>/`."""
    key = digest("tokens", _FORMAT, corpus.content_hash, tokenizer.identity, val_fraction)
    directory = cache / "tokens" / key[:24]
    if (directory / "meta.json").exists():
        try:
            return _open_store(directory)
        except (OSError, ValueError, KeyError):  # a damaged entry is rebuilt, not trusted
            shutil.rmtree(directory, ignore_errors=True)
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    with writing_cache(cache):
        staging.mkdir(parents=True)
    try:
        with writing_cache(cache):
            counts = _write_token_files(corpus, tokenizer, val_fraction, staging)
        meta = {
            "format": _FORMAT, "key": key, "corpus": corpus.description, "corpus_hash": corpus.content_hash,
            "tokenizer": tokenizer.kind, "tokenizer_identity": tokenizer.identity,
            "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id,
            "dtype": _token_dtype(tokenizer.vocab_size).name, "val_fraction": val_fraction,
            "n_train": counts["train"], "n_val": counts["val"], "n_documents": counts["documents"],
            "split": counts["split"],
        }
        with writing_cache(cache):
            atomic_write_text(staging / "meta.json", json.dumps(meta, indent=2))
        try:
            os.replace(staging, directory)
        except OSError:  # another process finished the same entry first; theirs is identical
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _open_store(directory)


# ── windows and batches ──────────────────────────────────────────────────────────────────────────────────────────


def _gather(tokens: np.ndarray, windows: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of seq_len + 1 tokens → inputs (B, T) and targets (B, T): the same window shifted by one."""
    rows = np.stack([tokens[w * seq_len: w * seq_len + seq_len + 1] for w in windows]).astype(np.int64)
    batch = torch.from_numpy(rows)  # (B, T + 1)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # (B, T) each; contiguous, as models may .view


def window_count(n_tokens: int, seq_len: int) -> int:
    """Windows start every seq_len tokens and hold seq_len + 1, so consecutive windows share one token and every
    token but the first is a target exactly once per epoch."""
    return max(0, (n_tokens - 1) // seq_len)


class WindowSampler(EpochSampler):
    """Training windows of a token stream, in the order of archspec.train.sampling."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        super().__init__(batch_size, seed, rank, world)
        self.tokens, self.seq_len = tokens, seq_len
        self.n_windows = window_count(len(tokens), seq_len)
        if self.n_windows == 0:
            raise UserError(f"the training split holds {len(tokens)} tokens, fewer than one window of "
                            f"train.seq_len + 1 = {seq_len + 1}; use a larger corpus or a shorter train.seq_len")

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _gather(self.tokens, self.my_items(), self.seq_len)


def val_windows(n_tokens: int, seq_len: int, eval_tokens: int, rank: int = 0, world: int = 1) -> np.ndarray:
    """The fixed validation windows of a split of `n_tokens` tokens this rank evaluates (val_batches' rule)."""
    n_windows = window_count(n_tokens, seq_len)
    if n_windows < world:
        raise UserError(f"the validation split holds {n_tokens} tokens, fewer than {world} window(s) of "
                        f"train.seq_len + 1 = {seq_len + 1}; raise train.data.val_fraction or use a larger corpus")
    wanted = -(-max(1, eval_tokens) // seq_len)
    count = min(n_windows // world, -(-wanted // world)) * world
    return (np.arange(count) * n_windows // count)[rank::world]


def val_batches(tokens: np.ndarray, seq_len: int, batch_size: int, eval_tokens: int, rank: int = 0,
                world: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed validation set of ceil(eval_tokens / seq_len) windows (at most the split's), spread evenly over the
    split: the same for every seed and every batch size, so every variant of a sweep is evaluated on the same tokens
    when they share seq_len. The count is a multiple of `world` (every process evaluates as many windows: a sharded
    model's forward is collective), and rank r evaluates every world-th window, `batch_size` at a time."""
    windows = val_windows(len(tokens), seq_len, eval_tokens, rank, world)
    return [_gather(tokens, windows[i: i + batch_size], seq_len) for i in range(0, len(windows), batch_size)]


# ── everything a run needs ───────────────────────────────────────────────────────────────────────────────────────


@dataclass
class TrainData:
    corpus: Corpus
    tokenizer: Tokenizer
    store: TokenStore
    sampler: WindowSampler
    val_batches: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def data_hash(self) -> str:
        """Names the tokens a run trains on: corpus content, tokenizer and split (not the path of any file)."""
        return self.store.key

    def describe(self) -> dict:
        m = self.store.meta
        return {"corpus": m["corpus"], "corpus_hash": m["corpus_hash"], "tokenizer": m["tokenizer"],
                "vocab_size": m["vocab_size"], "train_tokens": m["n_train"], "val_tokens": m["n_val"],
                "documents": m["n_documents"], "split": m["split"], "data_hash": self.data_hash}


def check_vocab(tokenizer: Tokenizer, model_vocab_size: int) -> None:
    if tokenizer.vocab_size > model_vocab_size:
        raise UserError(f"model.vocab_size: must be at least the {tokenizer.kind} tokenizer's vocabulary "
                        f"({tokenizer.vocab_size}, {tokenizer.vocab_note}), got {model_vocab_size}")


def prepare_tokens(data_spec: DataSpec, model_vocab_size: int, cache: Path) -> tuple[Corpus, Tokenizer, TokenStore]:
    """Corpus, tokenizer and token store, built into `cache` on first use (run this on one rank first)."""
    corpus = open_corpus(data_spec.corpus)
    tokenizer = build_tokenizer(data_spec.tokenizer, corpus, cache)  # the byte tokenizer reads no text
    check_vocab(tokenizer, model_vocab_size)
    return corpus, tokenizer, token_store(corpus, tokenizer, data_spec.val_fraction, cache)


def build_data(spec, cache: Path, *, rank: int = 0, world: int = 1) -> TrainData:
    t = spec.train
    if t.data.corpus.task:  # synthetic examples, generated in memory (cheaper than reading a cache)
        from archspec.train.tasks import task_data

        check_vocab(task_tokenizer()().build(None, None), spec.model.vocab_size)
        return task_data(spec, rank=rank, world=world)  # type: ignore[return-value]  # TrainData's interface
    if t.data.corpus.carries_media:  # documents with media beside them: windows that carry their items
        from archspec.train.media_data import media_data

        return media_data(spec, cache, rank=rank, world=world)  # type: ignore[return-value]  # TrainData's interface
    corpus, tokenizer, store = prepare_tokens(t.data, spec.model.vocab_size, cache)
    sampler = WindowSampler(store.train, t.seq_len, t.batch_size, t.seed, rank, world)
    val = val_batches(store.val, t.seq_len, t.batch_size, t.eval_size, rank, world)
    return TrainData(corpus, tokenizer, store, sampler, val)
