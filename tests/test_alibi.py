"""ALiBi as a positional kind (issue 26): BLOOM's and MPT's head slopes for any head count, the bias on every attention
path (dense, sparse, MLA) equal to a float64 reference, the cached decode equal to the full forward, generation past
the context for windowed models, no parameters, and the attention kinds that cannot take a bias refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.accounting import account
from archspec.cli import main
from archspec.codegen import generate
from archspec.kinds.attention import past_context_refusal
from archspec.spec import load_spec_dict
from archspec.testing.assertions import error_problems
from tests.test_generation import _lively, _mixed_spec, assert_cached_pieces_match_full_forward
from tests.test_scores import bloom_slopes, reference
from tests.tiny import tiny_spec


def mpt_slopes(n: int, alibi_bias_max: float = 8.0) -> torch.Tensor:
    """MPT's gen_slopes (transformers' modeling_mpt / llm-foundry), written out independently."""
    n2 = 2 ** math.ceil(math.log2(n))
    m = torch.arange(1, n2 + 1, dtype=torch.float32) * (alibi_bias_max / n2)
    slopes = 1.0 / torch.pow(2, m)
    if n2 != n:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n]
    return slopes


def _spec(n_heads=4, n_kv_heads=None, context=24, **attention):
    att = {"n_heads": n_heads, "positional": {"kind": "alibi"}, **attention}
    if n_kv_heads is not None:
        att["n_kv_heads"] = n_kv_heads
    return tiny_spec("alibi", vocab_size=61, context_length=context, d_model=n_heads * 8, n_layers=2, attention=att)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 20))
def test_slopes_equal_bloom_and_mpt_for_any_head_count(n, gen_dir):
    module = generate(_spec(n_heads=n), out_dir=gen_dir).module
    slopes = module.alibi_slopes(n)
    assert slopes.shape == (n,)
    assert torch.equal(slopes, bloom_slopes(n))  # bit for bit: the same float32 pow
    torch.testing.assert_close(slopes, mpt_slopes(n), rtol=1e-6, atol=0)


def _layer_reference(attn, x, slopes, visible):
    """The generated layer's projections, then attention by the float64 reference, then its output projection."""
    B, T, _ = x.shape
    H, Hkv, D = attn_dims(attn)
    q, k, v = attn.qkv_proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    y = reference(q, k, v, visible, slopes=slopes).float()
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, H * D))


def attn_dims(attn):
    D = 8
    H = attn.o_proj.in_features // D
    return H, (attn.qkv_proj.out_features // D - H) // 2, D


@pytest.mark.parametrize("sparsity,visible", [
    ({"kind": "dense"}, lambda i, j: j <= i),
    ({"kind": "sliding_window", "window": 5}, lambda i, j: i - 5 < j <= i),
    ({"kind": "global_local", "window": 4, "n_global": 2}, lambda i, j: j <= i and (i - 4 < j or j < 2)),
    ({"kind": "block_sparse", "block_size": 4, "n_blocks_back": 1}, lambda i, j: j <= i and (i // 4 - j // 4 <= 1 or j < 4)),
], ids=["dense", "window", "global_local", "block"])
@pytest.mark.parametrize("heads", [(6, 2), (5, 5)], ids=["gqa-6", "mha-5"])
def test_alibi_attention_equals_the_reference(sparsity, visible, heads, tmp_path):
    spec = _spec(n_heads=heads[0], n_kv_heads=heads[1], sparsity=sparsity)
    torch.manual_seed(0)
    model = generate(spec, out_dir=tmp_path).Model().eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 19, spec.model.d_model)
    with torch.no_grad():
        attn.qkv_proj.weight.mul_(8)  # scores of order 1: the bias competes with them
        torch.testing.assert_close(attn(x), _layer_reference(attn, x, bloom_slopes(heads[0]), visible),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", [
    {}, {"n_kv_heads": 1}, {"sparsity": {"kind": "sliding_window", "window": 5}},
    {"sparsity": {"kind": "global_local", "window": 4, "n_global": 3}},
    {"sparsity": {"kind": "block_sparse", "block_size": 4, "n_blocks_back": 1}}, {"softcap": 0.8},
    {"kind": "mla", "n_heads": 3, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6},
    {"kind": "mla", "n_heads": 3, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6,
     "sparsity": {"kind": "sliding_window", "window": 6}},
], ids=["dense", "mqa", "window", "global_local", "block", "capped", "mla", "mla-window"])
def test_cached_decode_equals_the_full_forward_with_alibi(attention, tmp_path):
    n_heads = attention.pop("n_heads", 6)
    spec = _spec(n_heads=n_heads, **attention)
    torch.manual_seed(0)
    model = generate(spec, out_dir=tmp_path).Model().eval()
    assert_cached_pieces_match_full_forward(_lively(model), 61, 24)


def test_alibi_has_no_parameters_and_no_buffers(tmp_path):
    spec, none = _spec(), _spec(positional={"kind": "none"})
    assert account(spec).total == account(none).total
    model = generate(spec, out_dir=tmp_path).Model()
    assert sum(p.numel() for p in model.parameters()) == account(spec).total
    assert not list(model.buffers())


def test_the_file_computes_its_slopes_and_passes_them_to_the_kernel(tmp_path):
    source = generate(_spec(), out_dir=tmp_path).source
    assert "def alibi_slopes(" in source and "alibi = alibi_slopes(N_HEADS, q.device)" in source
    assert "alibi=alibi" in source and "score_mod_attention(" in source  # SDPA cannot add a per-head bias


def test_a_windowed_alibi_model_generates_past_its_context_as_a_full_forward_would(gen_dir):
    spec = _mixed_spec({"kind": "sliding_window", "window": 4}, positional="alibi", every_layer=True, context=12)
    assert past_context_refusal(spec.model) is None
    torch.manual_seed(2)
    model = _lively(generate(spec, out_dir=gen_dir).Model().eval())
    prompt = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(3))
    out = model.generate(prompt, 30, temperature=0)  # 37 positions, three times the context
    seq = prompt
    with torch.no_grad():
        for _ in range(30):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_a_dense_alibi_model_keeps_its_context_length(gen_dir):
    spec = _spec(context=12)
    assert "layer 0 has dense causal attention" in past_context_refusal(spec.model)
    model = generate(spec, out_dir=gen_dir).Model().eval()
    with pytest.raises(ValueError, match="exceed CONTEXT_LENGTH 12"):
        model.generate(torch.zeros(1, 7, dtype=torch.long), 6)


def test_alibi_on_an_attention_kind_that_cannot_take_a_bias_exits_2_naming_the_field(monkeypatch, capsys, tmp_path):
    from archspec.kinds.attention import MLASpec

    monkeypatch.setattr(MLASpec, "takes_score_mods", False)  # as a kind whose template passes no score bias
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmodel: {vocab_size: 61, context_length: 16, d_model: 32, n_layers: 1, attention: "
                    "{kind: mla, n_heads: 2, kv_lora_rank: 8, qk_nope_head_dim: 4, qk_rope_head_dim: 4, v_head_dim: 4,"
                    " positional: {kind: alibi}}}\n")
    code = main(["build", str(spec), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    problems = error_problems(err)
    assert len(problems) == 1 and problems[0].startswith("model.attention.positional.kind: alibi adds a bias"), err
    monkeypatch.undo()
    assert load_spec_dict({"name": "s", "model": {"vocab_size": 61, "context_length": 16, "d_model": 32, "n_layers": 1,
                                                  "attention": {"kind": "mla", "n_heads": 2, "kv_lora_rank": 8,
                                                                "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
                                                                "v_head_dim": 4, "positional": {"kind": "alibi"}}}})
