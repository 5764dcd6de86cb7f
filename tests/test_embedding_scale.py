"""`model.embedding_scale`: scaling token embeddings by sqrt(d_model) is a model option of its own, independent of the
positional kind; the old spelling `positional.scale_embeddings` (and `train.eval_batches`) still loads, with a note."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from archspec.cli import main
from archspec.codegen import generate, render
from archspec.spec import load_spec_dict, model_json, model_hash
from archspec.spec.legacy import SpecNote
from tests.tiny import tiny_model, tiny_spec


def spec(**model):
    return tiny_spec("es", vocab_size=64, d_model=32, **model)  # the tests index tokens and scale by these


def _embedded(module, idx):
    """What enters the blocks: the input of the embedding dropout."""
    seen = {}
    handle = module.emb_drop.register_forward_hook(lambda m, args, out: seen.setdefault("x", args[0]))
    module(idx)
    handle.remove()
    return seen["x"]


@pytest.mark.parametrize("positional", [{"kind": "rope"}, {"kind": "sinusoidal"}, {"kind": "learned"},
                                        {"kind": "none"}])
def test_scaling_is_independent_of_the_positional_kind(positional):
    torch.manual_seed(0)
    plain = generate(spec(attention={"n_heads": 2, "positional": positional}), write=False).Model()
    scaled = generate(spec(attention={"n_heads": 2, "positional": positional}, embedding_scale="sqrt_d_model"),
                      write=False).Model()
    scaled.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 8))
    tokens = plain.tok_emb(idx)
    positions = _embedded(plain, idx) - tokens  # whatever the positional kind adds (zero for rope and none)
    assert torch.allclose(_embedded(scaled, idx), tokens * math.sqrt(32) + positions, atol=1e-6)
    assert sum(p.numel() for p in scaled.parameters()) == sum(p.numel() for p in plain.parameters())


def test_the_option_is_part_of_the_model_and_its_default_is_none():
    assert spec().model.embedding_scale == "none"
    assert model_hash(spec()) == model_hash(spec(embedding_scale="none"))  # the default written out: one hash
    assert model_hash(spec()) != model_hash(spec(embedding_scale="sqrt_d_model"))
    text = render(spec(embedding_scale="sqrt_d_model"))
    assert "EMBEDDING_SCALE = 5.656854249492381" in text and "x = x * EMBEDDING_SCALE" in text
    assert "EMBEDDING_SCALE" not in render(spec())


def test_old_spelling_loads_as_the_new_option_with_a_note():
    old = {"kind": "sinusoidal", "scale_embeddings": True}
    with pytest.warns(SpecNote, match="scale_embeddings: true is now model.embedding_scale: sqrt_d_model"):
        mapped = spec(attention={"n_heads": 2, "positional": old})
    new = spec(attention={"n_heads": 2, "positional": {"kind": "sinusoidal"}}, embedding_scale="sqrt_d_model")
    assert model_json(mapped) == model_json(new)
    with pytest.warns(SpecNote, match="is now model.embedding_scale: none"):
        off = spec(attention={"n_heads": 2, "positional": {"kind": "sinusoidal", "scale_embeddings": False}})
    assert off.model.embedding_scale == "none"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling, written out: no note
        spec(attention={"n_heads": 2, "positional": {"kind": "sinusoidal"}}, embedding_scale="none")


def test_old_spelling_on_the_command_line_is_a_visible_note_and_contradictions_exit_2(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text("name: old\nmodel: {vocab_size: 320, context_length: 16, d_model: 32, n_layers: 1,\n"
                    "  attention: {n_heads: 2, positional: {kind: sinusoidal, scale_embeddings: true}}}\n"
                    "train: {eval_batches: 3, batch_size: 2}\n")
    assert main(["build", str(path), "--out", str(tmp_path / "gen")]) == 0
    err = capsys.readouterr().err
    assert "note: model.attention.positional.scale_embeddings: true is now model.embedding_scale: sqrt_d_model" in err
    assert "note: train.eval_batches: 3 is now train.eval_tokens: 96" in err  # 3 × batch 2 × seq_len 16
    assert "EMBEDDING_SCALE" in (tmp_path / "gen" / "old.py").read_text()
    path.write_text("name: old\nmodel: {vocab_size: 320, context_length: 16, d_model: 32, n_layers: 1,\n"
                    "  embedding_scale: none,\n"
                    "  attention: {n_heads: 2, positional: {kind: sinusoidal, scale_embeddings: true}}}\n")
    assert main(["build", str(path), "--out", str(tmp_path / "gen")]) == 2
    err = capsys.readouterr().err
    assert "contradicts model.embedding_scale: none" in err and "Traceback" not in err
    path.write_text("name: old\nmodel: {vocab_size: 320, context_length: 16, d_model: 32, n_layers: 1,\n"
                    "  embedding_scale: sqrt_D, attention: {n_heads: 2}}\n")
    assert main(["build", str(path), "--out", str(tmp_path / "gen")]) == 2
    assert "model.embedding_scale" in capsys.readouterr().err


def test_hf_export_refuses_a_scaled_model(tmp_path, capsys):
    from archspec.spec import canonical_dict
    from archspec.train.checkpoint import save_weights

    s = load_spec_dict({"name": "x", "model": tiny_model(vocab_size=320, embedding_scale="sqrt_d_model")})
    save_weights(tmp_path / "x.pt", canonical_dict(s), model_hash(s), generate(s, write=False).Model().state_dict())
    assert main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model.embedding_scale" in err and "Traceback" not in err and not (tmp_path / "out").exists()
