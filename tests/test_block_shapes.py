"""Block shapes (issue 26): where a block's norms sit (`model.block.norm_placement`), parallel blocks
(`model.block.parallel`, `shared_norm`), no final norm, an LM-head bias, soft-capped logits, RMSNorm's (1 + w) gain
and q/k norm over the whole projection. Each generated block is checked against its formula, recomputed here from the
block's own submodules."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec import testing as T
from archspec.accounting import account
from archspec.cli import main
from archspec.codegen import generate, render
from archspec.spec import load_spec_dict, model_hash
from archspec.testing import assert_causal
from tests.tiny import tiny_spec

SHAPES = [("pre", False, False), ("post", False, False), ("sandwich", False, False), ("output", False, False),
          ("pre", True, False), ("pre", True, True), ("sandwich", True, False), ("sandwich", True, True)]


def shape_spec(placement="pre", parallel=False, shared=False, **model):
    block = {"norm_placement": placement, "parallel": parallel, "shared_norm": shared}
    return tiny_spec("shape", block=block, n_layers=2, **model)


def reference_block(block, shape, x, *args):
    """The block's formula, from its submodules (archspec.spec.layers.BlockShape)."""
    placement, parallel, shared = shape
    attn = lambda h: block.attn(h, *args, None)  # noqa: E731
    if parallel:
        a_in = block.norm(x) if shared else block.attn_norm(x)
        f_in = block.norm(x) if shared else block.ffn_norm(x)
        a, f = attn(a_in), block.ffn(f_in)
        if placement == "sandwich":
            a, f = block.attn_post_norm(a), block.ffn_post_norm(f)
        return x + a + f
    if placement == "pre":
        x = x + attn(block.attn_norm(x))
        return x + block.ffn(block.ffn_norm(x))
    if placement == "post":
        x = block.attn_norm(x + attn(x))
        return block.ffn_norm(x + block.ffn(x))
    if placement == "sandwich":
        x = x + block.attn_post_norm(attn(block.attn_norm(x)))
        return x + block.ffn_post_norm(block.ffn(block.ffn_norm(x)))
    x = x + block.attn_post_norm(attn(x))
    return x + block.ffn_post_norm(block.ffn(x))


def _randomised(model):
    """Norm gains away from 1 (and (1 + w) offsets away from 0), so a misplaced norm changes the output."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return model


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from(SHAPES), norm=st.sampled_from([{"kind": "rmsnorm"}, {"kind": "layernorm"},
                                                            {"kind": "rmsnorm", "unit_offset": True}]),
       positional=st.sampled_from(["rope", "learned", "none"]))
def test_each_block_computes_its_formula(shape, norm, positional):
    spec = shape_spec(*shape, norm=norm, attention={"n_heads": 2, "positional": {"kind": positional}})
    torch.manual_seed(0)
    model = _randomised(generate(spec, write=False).Model().eval())
    x = torch.randn(2, 7, 32)
    args = ()
    if positional == "rope":
        args = model.rope(7, 0)
    block = model.blocks[0]
    assert torch.allclose(block(x, *args), reference_block(block, shape, x, *args), atol=1e-5)
    # norms: as many as the shape has, each a module of the block's own norm class
    norms = [n for n, _ in block.named_children() if "norm" in n]
    assert len(norms) == spec.model.block.n_norms


@settings(max_examples=20, deadline=None)
@given(spec=T.valid_specs(max_layers=3, ffn_kinds=["mlp", "glu"], train=False), data=st.data())
def test_drawn_shapes_account_exactly_stay_causal_and_decode_as_the_full_forward(spec, data):
    """Over drawn specs (every new field drawn, per layer too; MoE's routing has tests of its own)."""
    m = spec.model
    torch.manual_seed(0)
    model = generate(spec, write=False).Model().eval()
    assert sum(p.numel() for p in model.parameters()) == account(spec).total
    T_ = min(m.context_length, 8)
    assert_causal(model, m.vocab_size, T_, data.draw(st.integers(0, T_ - 1)))
    idx = torch.randint(0, m.vocab_size, (1, T_))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(1, T_)
        split = data.draw(st.integers(1, T_))
        parts = [model(idx[:, :split], cache=cache)] + [model(idx[:, i:i + 1], cache=cache) for i in range(split, T_)]
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-4)


def test_class_names_and_docstrings_say_the_shape():
    names = {shape: [ln for ln in render(shape_spec(*shape)).splitlines() if ln.startswith("class ") and "Block" in ln]
             for shape in SHAPES}
    assert names[("pre", False, False)] == ["class Block(nn.Module):"]  # as every file said before
    assert names[("post", False, False)] == ["class PostNormBlock(nn.Module):"]
    assert names[("pre", True, False)] == ["class ParallelBlock(nn.Module):"]
    assert names[("pre", True, True)] == ["class SharedNormParallelBlock(nn.Module):"]
    text = render(shape_spec("post"))
    assert "x = self.attn_norm(x + self.resid_drop(self.attn(x, cos, sin, cache)))  # (B, T, D_MODEL)" in text
    # mixed per layer: a class per shape, the pre-norm one named beside the others
    mixed = tiny_spec("mixed", n_layers=3, layers={"first": {"select": [0], "block": {"norm_placement": "post"}}})
    text = render(mixed)
    assert "class PostNormBlock(nn.Module):" in text and "class PreNormBlock(nn.Module):" in text
    assert "PostNormBlock(Attention(), FeedForward()),  # layer 0" in text
    assert "*(PreNormBlock(Attention(), FeedForward()) for _ in range(2)),  # layers 1-2" in text


def test_defaults_keep_every_hash_and_written_defaults_hash_alike():
    plain = tiny_spec("h")
    written = tiny_spec("h", block={"norm_placement": "pre", "parallel": False, "shared_norm": False},
                        final_norm=True, lm_head_bias=False, logit_softcap=None,
                        norm={"kind": "rmsnorm", "unit_offset": False}, attention={"qk_norm": None})
    assert model_hash(plain) == model_hash(written)
    changed = {model_hash(tiny_spec("h", **kw)) for kw in (
        {"block": {"norm_placement": "post"}}, {"block": {"parallel": True}}, {"final_norm": False},
        {"lm_head_bias": True}, {"logit_softcap": 30.0}, {"norm": {"unit_offset": True}},
        {"attention": {"qk_norm": {"scope": "projection"}}}, {"attention": {"qk_norm": {}}})}
    assert len(changed) == 8 and model_hash(plain) not in changed
    # a layer group that sets the model-wide block again changes nothing (its group is not written)
    grouped = tiny_spec("h", n_layers=2, layers={"g": {"select": [1], "block": {"norm_placement": "pre"}}})
    assert model_hash(grouped) == model_hash(tiny_spec("h", n_layers=2))


@pytest.mark.parametrize("block,path,words", [
    ({"shared_norm": True}, "model.block.shared_norm", "only a parallel block shares its input norm"),
    ({"parallel": True, "norm_placement": "post"}, "model.block.norm_placement", "must be pre or sandwich, got post"),
    ({"parallel": True, "norm_placement": "output"}, "model.block.norm_placement", "got output"),
    ({"norm_placement": "middle"}, "model.block.norm_placement", "'pre', 'post', 'sandwich' or 'output'"),
])
def test_bad_shapes_exit_2_naming_the_field(tmp_path, capsys, block, path, words):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nmodel: {vocab_size: 320, context_length: 16, d_model: 32, n_layers: 1, "
                    f"attention: {{n_heads: 2}}, block: {json.dumps(block)}}}\n")
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert path in err and words in err and "Traceback" not in err


def test_a_layer_groups_bad_shape_is_blamed_at_the_group(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nmodel: {vocab_size: 320, context_length: 16, d_model: 32, n_layers: 2, "
                    "attention: {n_heads: 2}, layers: {g: {select: [1], block: {shared_norm: true}}}}\n")
    assert main(["build", str(spec), "--out", str(tmp_path)]) == 2
    assert "model.layers.g.block.shared_norm: only a parallel block" in capsys.readouterr().err


def test_set_reaches_the_block_and_the_schema_lists_it(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmodel: {vocab_size: 320, context_length: 16, d_model: 32, n_layers: 1, "
                    "attention: {n_heads: 2}}\n")
    assert main(["build", str(spec), "--out", str(tmp_path), "--set", "model.block.parallel=true",
                 "--set", "model.block.shared_norm=true", "--set", "model.logit_softcap=20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "class SharedNormParallelBlock" in (tmp_path / "s.py").read_text()
    assert out["params"]["by_component"]["norm"] == 2 * 32  # one shared norm and the final one (RMSNorm)
    assert main(["schema"]) == 0
    schema = capsys.readouterr().out
    for word in ("norm_placement", "shared_norm", "final_norm", "lm_head_bias", "logit_softcap", "unit_offset",
                 '"projection"'):
        assert word in schema


def test_post_norm_init_and_unit_offset_gain():
    spec = shape_spec("post", norm={"kind": "rmsnorm", "unit_offset": True}, final_norm=False)
    model = generate(spec, write=False).Model()
    assert not hasattr(model, "final_norm")
    for name, p in model.named_parameters():
        if "norm" in name and ".attn." not in name:
            assert torch.equal(p, torch.zeros_like(p)), name  # (1 + w): w starts at 0, the identity gain
    block = model.blocks[0]
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        block.attn_norm.weight.normal_()
        expected = torch.nn.functional.rms_norm(x, (32,), eps=1e-5) * (1 + block.attn_norm.weight)
    assert torch.allclose(block.attn_norm(x), expected, atol=1e-6)


def test_logit_softcap_and_lm_head_bias():
    torch.manual_seed(0)
    plain = generate(tiny_spec("cap", tie_embeddings=False, lm_head_bias=True), write=False).Model().eval()
    capped = generate(tiny_spec("cap", tie_embeddings=False, lm_head_bias=True, logit_softcap=0.5),
                      write=False).Model().eval()
    assert torch.equal(plain.lm_head.bias, torch.zeros(64))  # zero init
    with torch.no_grad():
        plain.lm_head.bias.normal_()
        plain.lm_head.weight.mul_(50)  # logits well past the cap
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        raw, out = plain(idx), capped(idx)
    assert raw.abs().max() > 2
    assert out.abs().max() <= 0.5 and torch.allclose(out, 0.5 * torch.tanh(raw / 0.5), atol=1e-6)
    assert "LOGIT_SOFTCAP" not in render(tiny_spec("cap"))


def test_qk_norm_over_the_projection_normalises_all_heads_at_once():
    spec = tiny_spec("qk", attention={"n_heads": 4, "n_kv_heads": 2, "qk_norm": {"scope": "projection"}})
    model = generate(spec, write=False).Model()
    attn = model.blocks[0].attn
    assert attn.q_norm.weight.shape == (32,) and attn.k_norm.weight.shape == (16,)  # N_HEADS·8, N_KV_HEADS·8
    head = generate(tiny_spec("qk", attention={"n_heads": 4, "n_kv_heads": 2, "qk_norm": {}}), write=False).Model()
    assert head.blocks[0].attn.q_norm.weight.shape == (8,)
    assert account(spec).by_component["attention"] - account(tiny_spec("qk", attention={
        "n_heads": 4, "n_kv_heads": 2})).by_component["attention"] == 48


def test_registry_filters_reach_the_block_fields(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    for name, block in (("seq", "{}"), ("par", "{parallel: true, shared_norm: true}"), ("post", "{norm_placement: post}")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nmodel: {{vocab_size: 320, context_length: 16, d_model: 32, n_layers: 1, "
                        f"attention: {{n_heads: 2}}, block: {block}}}\n")
        assert main(["build", str(path), "--out", str(tmp_path / "gen"), "--registry", url, "--json"]) == 0
    capsys.readouterr()
    for where, names in (("params.model.block.parallel = true", {"par"}),
                         ("params.model.block.norm_placement = 'post'", {"post"}),
                         ("params.model.block.shared_norm = true or params.model.block.norm_placement = 'post'",
                          {"par", "post"})):
        assert main(["specs", "list", "--registry", url, "--where", where, "--format", "json"]) == 0
        assert {row["names"] for row in json.loads(capsys.readouterr().out)} == names, where
