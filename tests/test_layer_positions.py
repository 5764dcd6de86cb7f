"""Per-layer positions (issue 26): a layer group may switch positions off (`attention: {positional: {kind: none}}`,
SmolLM3's NoPE every fourth layer) under a positional kind applied inside attention (rope, alibi); the tables stay
the model's; everything else a group could write there is refused at its path."""

from __future__ import annotations

import pytest
import torch

from archspec.cli import main
from archspec.codegen import generate
from archspec.spec import load_spec_dict, model_hash, model_json
from archspec.testing.assertions import error_problems
from tests.test_generation import _lively, assert_cached_pieces_match_full_forward

NOPE = {"nope": {"select": {"start": 3, "step": 4}, "attention": {"positional": {"kind": "none"}}}}


def _spec(layers=NOPE, positional=None, n_layers=8, **attention):
    att = {"n_heads": 4, "n_kv_heads": 2, **attention}
    if positional is not None:
        att["positional"] = positional
    return load_spec_dict({"name": "nope", "model": {"vocab_size": 61, "context_length": 16, "d_model": 32,
                                                     "n_layers": n_layers, "attention": att, "layers": layers}})


def test_smollm3_nope_every_fourth_layer(tmp_path):
    spec = _spec()
    kinds = [b.attention.positional.kind for b in spec.model.blocks()]
    assert kinds == ["rope", "rope", "rope", "none"] * 2
    gen = generate(spec, out_dir=tmp_path)
    assert gen.source.count("class Rotary(") == 1  # one table, the model's
    assert "class NoPEDenseAttention" in gen.source and "Block(NoPEDenseAttention(), FeedForward()),  # layer 3" in gen.source
    torch.manual_seed(0)
    model = gen.Model().eval()
    x = torch.randn(1, 9, 32)
    cos, sin = model.rope(9)
    flat = torch.ones_like(cos), torch.zeros_like(sin)  # no rotation at all
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            rotated, unrotated = block.attn(x, cos, sin), block.attn(x, *flat)
            if kinds[i] == "none":  # a NoPE layer ignores the angles it is handed
                torch.testing.assert_close(rotated, unrotated, atol=0, rtol=0)
            else:
                assert not torch.allclose(rotated, unrotated, atol=1e-5)


@pytest.mark.parametrize("positional, attention", [
    (None, {}), ({"kind": "alibi"}, {}), ({"kind": "alibi"}, {"sparsity": {"kind": "sliding_window", "window": 5}}),
    ({"kind": "rope", "partial": 0.5}, {"softcap": 0.7}),
], ids=["rope", "alibi", "alibi-window", "partial-rope-capped"])
def test_cached_decode_equals_the_full_forward_with_nope_layers(positional, attention, tmp_path):
    spec = _spec(positional=positional, n_layers=4, **attention)
    assert {b.attention.positional.kind for b in spec.model.blocks()} == {(positional or {}).get("kind", "rope"),
                                                                           "none"}
    torch.manual_seed(0)
    assert_cached_pieces_match_full_forward(_lively(generate(spec, out_dir=tmp_path).Model().eval()), 61, 16)


def test_the_canonical_form_keeps_the_models_positions_model_wide_and_round_trips():
    # most layers without positions: the model-wide attention is still the one with the model's positions
    spec = _spec({"off": {"select": [0, 1, 2, 4, 5, 6, 7], "attention": {"positional": {"kind": "none"}}}})
    data = load_spec_dict({"name": "x", "model": __import__("json").loads(model_json(spec))})
    assert model_hash(data) == model_hash(spec)
    assert [b.attention.positional.kind for b in data.model.blocks()] == ["none"] * 3 + ["rope"] + ["none"] * 4
    # writing the model's own positions in a group changes nothing
    same = _spec({"g": {"select": [1], "attention": {"positional": {"kind": "rope"}, "qkv_bias": True}}})
    plain = _spec({"g": {"select": [1], "attention": {"qkv_bias": True}}})
    assert model_hash(same) == model_hash(plain)
    assert model_hash(_spec({})) != model_hash(_spec())


@pytest.mark.parametrize("layers, positional, why", [
    ({"g": {"select": [1], "attention": {"positional": {"kind": "rope", "theta": 500.0}}}}, None,
     "may only switch positions off"),
    ({"g": {"select": [1], "attention": {"positional": {"kind": "alibi"}}}}, None, "may only switch positions off"),
    ({"g": {"select": [1], "attention": {"positional": {"kind": "none"}}}}, {"kind": "learned"},
     "cannot be switched off per layer under learned"),
    ({"g": {"select": [1], "attention": {"positional": {"kind": "none"}}}}, {"kind": "sinusoidal"},
     "cannot be switched off per layer under sinusoidal"),
    ({"g": {"select": {"start": 0}, "attention": {"positional": {"kind": "none"}}}}, None,
     "switches positions off in every layer"),
    ({"g": {"select": [1], "attention": {"positional": {"kind": "wobble"}}}}, None, "kind must be one of"),
], ids=["other-theta", "other-kind", "learned", "sinusoidal", "every-layer", "unknown-kind"])
def test_what_a_layer_group_may_not_do_to_positions_exits_2_at_its_path(layers, positional, why, tmp_path, capsys):
    import yaml

    att = {"n_heads": 4, "n_kv_heads": 2, **({"positional": positional} if positional else {})}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "model": {"vocab_size": 320, "context_length": 16, "d_model": 32,
                                                           "n_layers": 4, "attention": att, "layers": layers}}))
    assert main(["build", str(path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    problems = error_problems(err)
    assert "Traceback" not in err and len(problems) == 1, err
    assert problems[0].startswith("model.layers.g.attention.positional") and why in problems[0], err
