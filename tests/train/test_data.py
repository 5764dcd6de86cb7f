"""Corpora, tokenizers, the token store, windows, the split, sampling order and the refusals."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from archspec.errors import UserError
from archspec.spec import load_spec_dict
from archspec.spec.train import BPETokenizer as BPESpec
from archspec.spec.train import DataSpec
from archspec.train import data as data_mod
from archspec.data.corpus.files import FilesSource
from archspec.data.corpus.stdlib import StdlibSource
from archspec.train.data import (
    WindowSampler,
    _is_val_document,
    build_data,
    prepare_tokens,
    val_batches,
)
from archspec.data.tokenizer.byte import ByteCodec as ByteTokenizer
from archspec.data.tokenizer.common import EOS_TEXT
from archspec.train.tokenizer import build_tokenizer

from .conftest import tiny_spec_dict


def files_spec(*paths, val_fraction=0.1, tokenizer=None) -> DataSpec:
    return DataSpec(corpus={"kind": "files", "paths": [str(p) for p in paths]}, val_fraction=val_fraction,
                    tokenizer=tokenizer or {"kind": "byte"})


def write_docs(dir_, docs: dict[str, str]):
    dir_.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (dir_ / name).write_text(text, encoding="utf-8")
    return dir_


# ── corpora ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_stdlib_corpus_is_sorted_source_without_test_suites():
    corpus = StdlibSource()
    assert corpus.files == sorted(corpus.files) and len(corpus.files) > 100
    assert all(p.suffix == ".py" for p in corpus.files)
    assert not any({"test", "tests", "site-packages"} & set(p.relative_to(corpus.root).parts) for p in corpus.files)
    assert len(corpus.content_hash) == 64 and corpus.content_hash == StdlibSource().content_hash


def test_files_corpus_reads_files_dirs_and_jsonl_in_order(tmp_path):
    write_docs(tmp_path / "d", {"b.txt": "bee", "a.txt": "ay", ".hidden": "skip me"})
    (tmp_path / "x.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n', encoding="utf-8")
    (tmp_path / "single.md").write_text("single", encoding="utf-8")
    corpus = FilesSource([str(tmp_path / "d"), str(tmp_path / "x.jsonl"), str(tmp_path / "single.md")])
    assert list(corpus.documents()) == ["ay", "bee", "one", "two", "single"]


def test_content_hash_follows_content_not_names(tmp_path):
    a = write_docs(tmp_path / "a", {"1.txt": "hello", "2.txt": "world"})
    b = write_docs(tmp_path / "b", {"x.txt": "hello", "y.txt": "world"})
    c = write_docs(tmp_path / "c", {"1.txt": "hellow", "2.txt": "orld"})  # same bytes, other document boundary
    hashes = [FilesSource([str(p)]).content_hash for p in (a, b, c)]
    assert hashes[0] == hashes[1] != hashes[2]


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "no such corpus file or directory"),
    (lambda p: p.mkdir(), "holds no files"),
    (lambda p: p.write_text(""), "corpus is empty"),
    (lambda p: p.write_bytes(b"\xff\xfe bad"), "not UTF-8 text"),
])
def test_refuses_missing_empty_and_unreadable_corpora(tmp_path, setup, message):
    path = tmp_path / "corpus"
    setup(path)
    with pytest.raises(UserError, match=message):
        prepare_tokens(files_spec(path), 320, tmp_path / "cache")


@pytest.mark.parametrize("line, message", [("{not json", r"x.jsonl:2: invalid JSON"),
                                           ('{"body": "no text"}', r"x.jsonl:2: expected an object with a string `text`")])
def test_refuses_bad_jsonl_with_file_and_line(tmp_path, line, message):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=message):
        prepare_tokens(files_spec(path), 320, tmp_path / "cache")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_refuses_unreadable_file(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("text")
    path.chmod(0)
    with pytest.raises(UserError, match="cannot read corpus file"):
        prepare_tokens(files_spec(path), 320, tmp_path / "cache")


def test_refuses_vocab_smaller_than_tokenizer(corpus_dir):
    data = tiny_spec_dict(corpus_dir)
    data["model"]["vocab_size"] = 200
    with pytest.raises(UserError, match=r"model.vocab_size: must be at least the byte tokenizer's vocabulary \(257"):
        build_data(load_spec_dict(data), corpus_dir.parent / "unused-cache")


# ── tokenizers ───────────────────────────────────────────────────────────────────────────────────────────────────


def test_byte_tokenizer_round_trips_utf8():
    tok = ByteTokenizer()
    text = "naïve → ok"
    (ids,) = tok.encode_batch([text])
    assert tok.vocab_size == 257 and tok.eos_id == 256 and ids.max() < 256
    assert tok.decode(list(ids) + [tok.eos_id]) == text


def test_bpe_is_trained_once_then_read_from_the_cache(corpus_dir, tmp_path, monkeypatch):
    corpus = FilesSource([str(corpus_dir)])
    spec = BPESpec(vocab_size=300)
    tok = build_tokenizer(spec, corpus, tmp_path)
    assert tok.vocab_size <= 300 and tok.eos_id is not None
    text = "def f(x):\n    return x  # " + EOS_TEXT
    (ids,) = tok.encode_batch([text])
    assert tok.decode(ids) == text and tok.eos_id not in ids.tolist()  # quoted EOS text stays text
    monkeypatch.setattr(type(tok), "train", classmethod(lambda *a, **k: pytest.fail("trained again")))
    again = build_tokenizer(spec, corpus, tmp_path)
    assert again.identity == tok.identity and again.encode_batch([text])[0].tolist() == ids.tolist()


def test_bpe_token_store_uses_its_vocabulary(corpus_dir, tmp_path):
    _, tok, store = prepare_tokens(files_spec(corpus_dir, tokenizer={"kind": "bpe", "vocab_size": 300}), 320, tmp_path)
    assert store.meta["tokenizer"] == "bpe" and store.train.max() < tok.vocab_size <= 300


# ── the token store ──────────────────────────────────────────────────────────────────────────────────────────────


def test_documents_are_followed_by_eos(tmp_path):
    docs = {f"{i:02d}.txt": f"document number {i} " * (i + 1) for i in range(40)}
    _, tok, store = prepare_tokens(files_spec(write_docs(tmp_path / "c", docs)), 320, tmp_path / "cache")
    assert store.train.dtype == np.uint16 and store.meta["n_documents"] == 40 and store.meta["split"] == "documents"
    expected = {"train": [], "val": []}
    for text in docs.values():
        side = "val" if _is_val_document(text, 0.1) else "train"
        expected[side].extend(list(text.encode()) + [tok.eos_id])
    assert store.train.tolist() == expected["train"] and store.val.tolist() == expected["val"]
    assert expected["val"], "some documents land in val at 10% of 40"


def test_split_is_by_document_content_and_deterministic(tmp_path):
    docs = {f"{i:03d}.txt": f"doc {i}\n" * 20 for i in range(200)}
    corpus_a = write_docs(tmp_path / "a", docs)
    corpus_b = write_docs(tmp_path / "b", {f"z{k}": v for k, v in reversed(docs.items())})  # other names and order
    val_a = [t for t in docs.values() if _is_val_document(t, 0.1)]
    assert 5 < len(val_a) < 40
    sa = prepare_tokens(files_spec(corpus_a), 320, tmp_path / "cache")[2]
    sb = prepare_tokens(files_spec(corpus_b), 320, tmp_path / "cache")[2]
    assert sa.meta["n_val"] == sb.meta["n_val"] == sum(len(t.encode()) + 1 for t in val_a)


def test_a_single_document_is_split_by_tokens(tmp_path):
    text = "".join(f"line {i}\n" for i in range(500))
    store = prepare_tokens(files_spec(write_docs(tmp_path / "c", {"only.txt": text}), val_fraction=0.1), 320,
                           tmp_path / "cache")[2]
    n = len(text.encode()) + 1
    assert store.meta["split"] == "tokens" and store.meta["n_val"] == -(-n // 10)
    assert np.concatenate([store.train, store.val]).tolist() == list(text.encode()) + [256]


def test_token_store_is_built_once(corpus_dir, tmp_path, monkeypatch):
    first = prepare_tokens(files_spec(corpus_dir), 320, tmp_path)[2]
    monkeypatch.setattr(data_mod, "_write_token_files", lambda *a: pytest.fail("tokenised again"))
    second = prepare_tokens(files_spec(corpus_dir), 320, tmp_path)[2]
    assert second.directory == first.directory and np.array_equal(second.train, first.train)
    assert json.loads((first.directory / "meta.json").read_text())["key"] == first.key


def test_a_damaged_store_is_rebuilt(corpus_dir, tmp_path):
    store = prepare_tokens(files_spec(corpus_dir), 320, tmp_path)[2]
    n_train = store.meta["n_train"]
    with open(store.directory / "train.bin", "r+b") as f:
        f.truncate(100)
    rebuilt = prepare_tokens(files_spec(corpus_dir), 320, tmp_path)[2]
    assert len(rebuilt.train) == n_train


# ── windows, sampling, sharding ─────────────────────────────────────────────────────────────────────────────────


def test_windows_are_shifted_by_one_and_cover_every_target_once_per_epoch():
    tokens = np.arange(1001, dtype=np.uint16)  # ids = positions, so a window tells where it came from
    sampler = WindowSampler(tokens, seq_len=10, batch_size=4, seed=1)
    assert sampler.n_windows == 100
    targets = []
    for _ in range(25):
        x, y = sampler.next_batch()
        assert x.shape == y.shape == (4, 10) and x.dtype == torch.long
        assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y, x + 1)
        assert (x[:, 0] % 10 == 0).all()  # windows start every seq_len tokens
        targets += y.flatten().tolist()
    assert sorted(targets) == list(range(1, 1001)) and sampler.epoch == 1 and sampler.cursor == 0


def test_same_seed_same_order_other_seed_other_order():
    tokens = np.arange(2001, dtype=np.uint16)
    runs = [[WindowSampler(tokens, 10, 4, seed).next_batch()[0] for _ in range(3)] for seed in (7, 7, 8)]
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not all(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))


def test_sampler_state_resumes_exactly_across_epochs():
    tokens = np.arange(301, dtype=np.uint16)
    a = WindowSampler(tokens, 10, 4, seed=3)
    for _ in range(11):  # 44 windows of 30: into the second epoch
        a.next_batch()
    b = WindowSampler(tokens, 10, 4, seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(20):
        assert all(torch.equal(u, v) for u, v in zip(a.next_batch(), b.next_batch()))


def test_sampler_refuses_state_from_other_data():
    a = WindowSampler(np.arange(301, dtype=np.uint16), 10, 4, seed=3)
    b = WindowSampler(np.arange(501, dtype=np.uint16), 10, 4, seed=3)
    with pytest.raises(UserError, match="n_windows"):
        b.load_state_dict(a.state_dict())


def test_ranks_split_the_same_global_batch():
    tokens = np.arange(5001, dtype=np.uint16)
    single = WindowSampler(tokens, 10, 8, seed=0)
    ranks = [WindowSampler(tokens, 10, 4, seed=0, rank=r, world=2) for r in range(2)]
    for _ in range(5):
        x, _ = single.next_batch()
        assert torch.equal(x, torch.cat([s.next_batch()[0] for s in ranks]))


def test_val_batches_are_fixed_and_sharded_without_overlap():
    tokens = np.arange(2001, dtype=np.uint16)
    whole = torch.cat([x for x, _ in val_batches(tokens, 10, 4, 120)])  # 120 tokens: 12 windows of 10
    assert whole.shape == (12, 10) and len(set(whole[:, 0].tolist())) == 12
    shards = [torch.cat([x for x, _ in val_batches(tokens, 10, 2, 120, rank=r, world=2)]) for r in range(2)]
    assert sorted(torch.cat(shards)[:, 0].tolist()) == sorted(whole[:, 0].tolist())


def test_the_validation_set_is_sized_in_tokens_whatever_the_batch_size():
    tokens = np.arange(5001, dtype=np.uint16)
    sets = {b: torch.cat([x for x, _ in val_batches(tokens, 16, b, 100)]) for b in (1, 3, 8)}
    assert all(torch.equal(sets[1], s) for s in sets.values())  # the same windows for every batch size
    assert sets[1].numel() == 112  # ceil(100 / 16) = 7 windows of 16 targets
    # every process evaluates as many windows (a sharded forward is collective): 7 rounds up to 8 over 2
    shards = [torch.cat([x for x, _ in val_batches(tokens, 16, 3, 100, rank=r, world=2)]) for r in range(2)]
    assert [len(s) for s in shards] == [4, 4]
    # more than the split holds: the whole split, once
    everything = torch.cat([x for x, _ in val_batches(tokens, 16, 64, 10**9)])
    assert len(everything) == 312 and len(set(everything[:, 0].tolist())) == 312


def test_refuses_splits_shorter_than_one_window():
    with pytest.raises(UserError, match="training split holds 20 tokens"):
        WindowSampler(np.arange(20, dtype=np.uint16), 32, 4, seed=0)
    with pytest.raises(UserError, match="validation split holds 20 tokens"):
        val_batches(np.arange(20, dtype=np.uint16), 32, 4, 64)


def test_build_data_for_a_spec(make_spec, cache):
    data = build_data(make_spec(), cache)
    x, y = data.sampler.next_batch()
    assert x.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert len(data.val_batches) == 2 and len(data.data_hash) == 64
    assert data.describe()["train_tokens"] == len(data.store.train)
