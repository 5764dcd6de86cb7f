"""Media through the shared training loop (issue 46): windows of a media corpus carry the items of their markers (the
rule of archspec.train.media_data, as a property), a text-only model reads the text only, the data hash covers the
media, a media run resumes exactly, bad input exits 2 naming the field, and the media_recall task: a cross-attention
model learns it through `archspec train`, a text-only one stays at chance, and `archspec probe --task media_recall`
repeats the figure."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.data.corpus.media import write_example
from archspec.runtime import media_items
from archspec.errors import UserError
from archspec.spec import SpecError, load_spec_dict
from archspec.train import train
from archspec.train.media_data import media_data, media_stream, split_stream, window_batch

MARK = 257  # after the byte tokenizer's 256 bytes and EOS
LM = {"vocab_size": 320, "context_length": 32, "d_model": 32, "n_layers": 2, "attention": {"n_heads": 2},
      "ffn": {"kind": "glu", "hidden_dim": 64}}
MEDIA = {"width": 16, "tokens": 4, "max_items": 4, "marker_id": MARK,
         "cross_attention": {"every": 1, "n_heads": 2, "ffn_hidden": 64}}


def _spec(media: dict | None, corpus: dict, **train_fields):
    recipe = {"steps": 6, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "warmup_steps": 1, "eval_interval": 3,
              "compile": "none", "data": {"corpus": corpus, "val_fraction": 0.3}, **train_fields}
    return load_spec_dict({"name": "media-run", "model": {**LM, **({"media": media} if media else {})},
                           "train": recipe})


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ARCHSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ARCHSPEC_REGISTRY", f"sqlite:///{tmp_path}/registry.db")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # these models are tiny: a second thread only waits (on a loaded 2-core CI machine, long)
    yield
    torch.set_num_threads(threads)


# ── the rule of a window ─────────────────────────────────────────────────────────────────────────────────────────


@st.composite
def _documents(draw):
    """Documents of byte ids with markers among them, each item a constant tensor of its own (item k: k + 1)."""
    docs, k = [], 0
    for _ in range(draw(st.integers(1, 6))):
        ids = draw(st.lists(st.one_of(st.integers(0, 255), st.just(MARK)), min_size=0, max_size=30))
        n = ids.count(MARK)
        docs.append((ids, torch.arange(k + 1, k + n + 1, dtype=torch.float32)[:, None, None].expand(n, 2, 3)))
        k += n
    return docs


@settings(max_examples=60, deadline=None)
@given(docs=_documents(), seq_len=st.integers(1, 12), cut=st.floats(0, 1))
def test_a_window_carries_the_items_of_its_markers_and_a_cut_marker_is_seen_by_no_token(docs, seq_len, cut):
    """Every window of every split: its media are the items of the markers among its inputs, in order, then zeros;
    each token sees (through the model's own rule, media_items) the item it sees in the whole stream, or none when
    that item's marker lies before the window; a marker is never a target."""
    whole = media_stream(docs, 256, MARK)
    assert len(whole.markers) == sum(len(m) for _, m in docs) and (whole.tokens[whole.markers] == MARK).all()
    for stream in split_stream(whole, int(cut * len(whole.tokens))):
        max_items = max(1, len(stream.markers))
        for w in range((len(stream.tokens) - 1) // seq_len if len(stream.tokens) > 1 else 0):
            x, y, media = window_batch(stream, np.array([w]), seq_len, MARK, max_items)
            start = w * seq_len
            assert torch.equal(x[0], torch.from_numpy(stream.tokens[start: start + seq_len]))
            nxt = torch.from_numpy(stream.tokens[start + 1: start + seq_len + 1])
            assert torch.equal(y[0], nxt.masked_fill(nxt == MARK, -100))
            seen = media_items(x, MARK, max_items)[0]
            for p in range(seq_len):
                g = int(np.searchsorted(stream.markers, start + p, side="right")) - 1  # in the whole split
                if seen[p] >= 0:
                    assert torch.equal(media[0, seen[p]], stream.items[g])
                else:
                    assert g < 0 or stream.markers[g] < start  # no marker yet, or its marker is in an earlier window
            n = int(((stream.markers >= start) & (stream.markers < start + seq_len)).sum())
            assert (media[0, n:] == 0).all() and (media[0, :n] != 0).all()


def test_a_text_only_model_reads_the_same_text_without_markers_and_the_hash_covers_the_media(tmp_path):
    root = write_example(tmp_path / "corpus", documents=30, width=16, tokens=4)
    corpus = {"kind": "media_text", "path": str(root)}
    with_media = media_data(_spec(MEDIA, corpus), tmp_path / "cache")
    text_only = media_data(_spec(None, corpus), tmp_path / "cache")
    for a, b in ((with_media.train, text_only.train), (with_media.val, text_only.val)):
        assert torch.equal(torch.from_numpy(a.tokens[a.tokens != MARK]), torch.from_numpy(b.tokens))
    assert b.items is None and all(len(batch) == 2 for batch in text_only.val_batches)
    assert all(len(batch) == 3 and batch[2].shape[1:] == (4, 4, 16) for batch in with_media.val_batches)
    assert len(text_only.sampler.next_batch()) == 2 and len(with_media.sampler.next_batch()) == 3
    assert with_media.data_hash != text_only.data_hash  # the markers are part of what a run reads
    # the media's bytes are part of the data hash
    (root / "0000.safetensors").write_bytes((root / "0002.safetensors").read_bytes())
    assert media_data(_spec(MEDIA, corpus), tmp_path / "cache").data_hash != with_media.data_hash


# ── through the loop ─────────────────────────────────────────────────────────────────────────────────────────────


def test_a_media_run_resumes_exactly_and_a_text_only_run_trains_on_the_same_corpus(tmp_path):
    from archspec.train.checkpoint import load_checkpoint
    from archspec.train.loop import Trainer

    root = write_example(tmp_path / "corpus", documents=30, width=16, tokens=4)
    spec = _spec(MEDIA, {"kind": "media_text", "path": str(root)}, checkpoint_interval=3)
    whole = train(spec, run_dir=tmp_path / "whole", device="cpu")
    assert whole.status == "FINISHED" and len(whole.losses) == 6
    crashing = Trainer(spec, run_dir=tmp_path / "crash", device="cpu")
    given = []

    def crash_in_step_5(module, args, kwargs):
        given.append(kwargs.get("media"))
        if module.training and sum(m is not None for m in given) > 4:
            raise RuntimeError("simulated crash")

    crashing.model.register_forward_pre_hook(crash_in_step_5, with_kwargs=True)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashing.run()
    assert given[0] is not None and given[0].shape == (4, 4, 4, 16)  # the model was given the batch's media
    assert load_checkpoint(tmp_path / "crash")["step"] == 3
    resumed = train(spec, resume=tmp_path / "crash", device="cpu")
    assert resumed.losses == whole.losses[3:]  # exact: the data position carries the media with it

    text = train(_spec(None, {"kind": "media_text", "path": str(root)}), run_dir=tmp_path / "text", device="cpu")
    assert text.status == "FINISHED" and text.metrics["val_loss"] > 0


def _cli_train(tmp_path, spec: dict) -> tuple[int, str]:
    import yaml

    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["train", str(path), "--json", "-q", "--device", "cpu", "--run-dir", str(tmp_path / spec["name"])])
    return rc, out.getvalue()


@pytest.mark.parametrize("change, field", [
    ({"width": 24}, "model.media.width"),  # the corpus's media are 16 wide
    ({"max_items": 1}, "model.media.max_items"),  # a window of 64 tokens holds more markers
], ids=["width", "max-items"])
def test_a_media_corpus_the_model_cannot_read_exits_2_naming_the_field(tmp_path, capsys, change, field):
    root = write_example(tmp_path / "corpus", documents=30, width=16, tokens=4)
    spec = {"name": "bad", "model": {**LM, "context_length": 64, "media": {**MEDIA, **change}},
            "train": {"steps": 2, "warmup_steps": 0, "seq_len": 64, "data": {"corpus": {"kind": "media_text", "path": str(root)},
                                                          "val_fraction": 0.3}}}
    rc, _ = _cli_train(tmp_path, spec)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and field in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_a_marker_that_is_a_tokenizer_id_exits_2_naming_the_field(tmp_path, capsys):
    root = write_example(tmp_path / "corpus", documents=4, width=16, tokens=4)
    spec = {"name": "bad", "model": {**LM, "media": {**MEDIA, "marker_id": 65}},
            "train": {"steps": 2, "warmup_steps": 0, "data": {"corpus": {"kind": "media_text", "path": str(root)}}}}
    rc, _ = _cli_train(tmp_path, spec)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("model.media.marker_id") == 1 and len(err.splitlines()) == 1, err


# ── media_recall ─────────────────────────────────────────────────────────────────────────────────────────────────

RECALL = {"kind": "media_recall", "pairs": 2, "keys": 8, "values": 8, "width": 16, "train_examples": 4000,
          "val_examples": 256}


def test_media_recall_examples_hold_the_answers_in_the_media_only():
    """The text gives keys and values in one order, the media the pairs in another; the same task draws the same
    examples; a text-only model's batches are the text alone, a media model's carry the media and its marker."""
    from archspec.data.base import MEDIA_MARK
    from archspec.data.corpus.media_recall import MediaRecallCorpus
    from archspec.train.tasks import generate

    task = MediaRecallCorpus(**{k: v for k, v in RECALL.items() if k != "kind"}, noise=0.0)
    ex = generate(task, 8, "val", 50)
    again = generate(task, 8, "val", 50)
    assert np.array_equal(ex.media, again.media) and ex.media.shape == (50, 1, 2, 16)
    key_code, value_code = task.codebooks()
    for row in range(50):
        pairs = {(int(ex.tokens[row, 1 + 2 * j]) - 4, int(ex.tokens[row, 2 + 2 * j]) - 12) for j in range(2)}
        coded = {tuple(key_code[k] + value_code[v]) for k, v in pairs}
        assert {tuple(t) for t in ex.media[row, 0]} == coded
    text = ex.batch(np.arange(4))
    inputs, targets, media = ex.batch(np.arange(4), MARK)
    assert len(text) == 2 and torch.equal(text[1], targets) and (text[0][:, 0] == MEDIA_MARK).all()
    assert (inputs[:, 0] == MARK).all() and media.shape == (4, 1, 2, 16)
    assert (targets[:, 0] == -100).all() and (targets[:, 1::2][:, :2] >= 12).all()  # answers: the values


@pytest.mark.parametrize("change, field", [
    ({"width": 24}, "model.media.width"), ({"tokens": 3}, "model.media.tokens"), ({"marker_id": 5},
                                                                                  "model.media.marker_id")])
def test_media_recall_refuses_a_model_that_cannot_read_it(change, field):
    with pytest.raises(SpecError) as err:
        _spec({**MEDIA, "tokens": 2, "max_items": 1, **change}, RECALL, seq_len=8)
    assert [line.split(":")[0] for line in err.value.problems] == [field]


def test_media_recall_is_learned_through_the_loop_with_cross_attention_and_not_without(tmp_path, capsys):
    """The answer is only in the media: the same tiny language model learns it through cross-attention, trained by
    `archspec train`, and stays at chance without; `archspec probe --task media_recall` repeats each figure."""
    lm = {**LM, "context_length": 8, "n_layers": 1}
    media = {**MEDIA, "tokens": 2, "max_items": 1}
    accuracy = {}
    for name, extra in (("xattn", {"media": media}), ("text", {})):
        spec = {"name": name, "model": {**lm, **extra},
                "train": {"steps": 100, "batch_size": 32, "seq_len": 8, "lr": 1.0e-2, "warmup_steps": 5,
                          "eval_interval": 100, "compile": "none", "data": {"corpus": RECALL}}}
        rc, out = _cli_train(tmp_path, spec)
        assert rc == 0, capsys.readouterr().err
        result = json.loads(out.strip().splitlines()[-1])
        trained = result["probe.accuracy"]
        rc = main(["probe", result["run_id"], "--task", "media_recall", "--device", "cpu", "--json"])
        probed = json.loads(capsys.readouterr().out)["metrics"]
        assert rc == 0 and probed["accuracy"] == pytest.approx(trained) and probed["chance"] == 1 / 8
        accuracy[name] = trained
        if name == "xattn":  # a task the model cannot read: one line, naming the option that fixes it
            wide = media["width"] + 8
            assert main(["probe", result["run_id"], "--task", "media_recall", "--width", str(wide)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"pass --width {media['width']} to probe with the run's own" in err[0], err
    assert accuracy["xattn"] > 0.6 and accuracy["text"] < 2.5 / 8, accuracy


# ── the memory plan ──────────────────────────────────────────────────────────────────────────────────────────────


def test_the_resampler_activations_in_the_memory_plan_are_what_autograd_saves():
    """The resampler's per-item figure against the tensors autograd keeps for its backward (each storage once, the
    parameters not counted); the memory plan adds it per sequence, max_items items at max_input_tokens features."""
    from archspec.codegen import generate
    from archspec.memory import plan_memory

    resampler = {"depth": 2, "n_heads": 2, "head_dim": 8, "max_input_tokens": 10}
    spec = _spec({**MEDIA, "tokens": 3, "width": 24, "resampler": resampler}, {"kind": "stdlib"})
    model = generate(spec, write=False).Model()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    items = 6
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.resampler(torch.randn(items, 10, 24))
    r = spec.model.media.resampler
    counted = items * r.saved_bytes_per_item(24, 3, 10, 4)
    assert counted <= sum(saved.values()) <= 1.05 * counted  # what is left out: the norms' per-row statistics
    without = _spec({**MEDIA, "tokens": 3, "width": 24}, {"kind": "stdlib"})
    assert (plan_memory(spec).activations - plan_memory(without).activations
            == spec.train.batch_size * MEDIA["max_items"] * r.saved_bytes_per_item(24, 3, 10, 4))


def test_a_document_may_hold_more_items_than_a_window_or_none(tmp_path):
    """max_items bounds a window, not a document (review finding): a long document with more items than max_items,
    whose windows each hold at most max_items markers, trains; so does a text-only document (a 0-item tensor)."""
    from archspec.media import MARKER_TEXT, write_safetensors

    root = tmp_path / "corpus"
    root.mkdir()
    filler = "def f(x):\n    return x * 2  # a line of text between the items\n" * 2
    for d in range(6):
        items = 3 if d % 2 else 0
        (root / f"{d:04d}.txt").write_text("".join(f"{filler}{MARKER_TEXT} item {k}\n" for k in range(items))
                                           + filler)
        write_safetensors(root / f"{d:04d}.safetensors",
                          {"media": torch.randn(items, 4, 16, generator=torch.Generator().manual_seed(d))})
    spec = _spec({**MEDIA, "max_items": 1}, {"kind": "media_text", "path": str(root)}, seq_len=16, steps=2,
                 eval_interval=2)
    result = train(spec, run_dir=tmp_path / "run", device="cpu")
    assert result.status == "FINISHED"


@pytest.mark.parametrize("entry", ["fifo-document", "fifo-media", "directory-document"])
def test_a_document_or_media_that_is_not_a_regular_file_is_refused_before_a_read(tmp_path, entry):
    import os

    from archspec.data.corpus.media import MediaSource

    root = write_example(tmp_path / "corpus", documents=2, width=16, tokens=4)
    if entry == "fifo-document":
        bad = root / "0002.txt"
        os.mkfifo(bad)
        write_example(tmp_path / "other", documents=1, width=16, tokens=4)
        os.replace(tmp_path / "other" / "0000.safetensors", root / "0002.safetensors")
    elif entry == "fifo-media":
        bad = root / "0001.safetensors"
        bad.unlink()
        os.mkfifo(bad)
    else:
        bad = root / "0002.txt"
        bad.mkdir()
    with pytest.raises(UserError, match="not a regular file") as err:
        MediaSource(str(root))  # a FIFO read would block here: refused from its type alone
    assert bad.name in str(err.value)
