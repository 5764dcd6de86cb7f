"""Attention scores changed before the softmax (issue 26): `softcap` (Gemma 2's tanh capping), `scale` (the softmax
scale) and ALiBi's bias, on every attention path: the dense manual path (score_mod_attention), the sparse blockwise
Function (forward and backward), FlexAttention's score_mod (forward, eager on CPU), the rolling and dense KV-cached
decode, and multi-head latent attention. Each against one float64 reference written from the papers' words."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.codegen import generate
from archspec.runtime import sparse
from archspec.runtime.scores import score_mod_attention
from archspec.testing.assertions import error_problems
from tests.test_generation import assert_cached_pieces_match_full_forward
from tests.tiny import tiny_spec

WINDOW = ({"kind": "sliding_window", "window": 5}, "SLIDING_WINDOW")
GLOBAL_LOCAL = ({"kind": "global_local", "window": 4, "n_global": 3}, "GLOBAL_LOCAL")
BLOCK = ({"kind": "block_sparse", "block_size": 4, "n_blocks_back": 1}, "BLOCK_SPARSE")


def bloom_slopes(n: int) -> torch.Tensor:
    """BLOOM's build_alibi_tensor slopes (transformers' modeling_bloom), written out here independently."""
    closest = 2 ** math.floor(math.log2(n))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != n:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        remaining = min(closest, n - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32))])
    return slopes


def reference(q, k, v, visible, *, scale=None, softcap=None, slopes=None):
    """float64, one (query, key) at a time in spirit: s = scale · q·k; s = cap · tanh(s / cap); s += slope_h ·
    (j − i); softmax over the keys query i sees (`visible(i, j)`)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, T, D = q.shape
    G = H // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = q @ k.transpose(-1, -2) * (D**-0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if slopes is not None:
        s = s + slopes.double()[:, None, None] * (j - i)
    mask = torch.tensor([[visible(a, b) for b in range(T)] for a in range(T)])
    s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v


def causal(i, j):
    return j <= i


def _qkv(B, H, H_kv, T, D, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g, dtype=dtype) * 2, torch.randn(B, H_kv, T, D, generator=g, dtype=dtype) * 2,
            torch.randn(B, H_kv, T, D, generator=g, dtype=dtype))


scores_options = st.fixed_dictionaries({
    "softcap": st.one_of(st.none(), st.floats(0.1, 50.0)),
    "scale": st.one_of(st.none(), st.floats(0.05, 2.0)),
    "alibi": st.booleans(),
})


@settings(max_examples=30, deadline=None)
@given(opts=scores_options, heads=st.sampled_from([(1, 1), (4, 2), (3, 1), (6, 6)]), T=st.integers(1, 9))
def test_dense_score_mod_attention_equals_the_float64_reference(opts, heads, T):
    H, H_kv = heads
    q, k, v = _qkv(2, H, H_kv, T, 4)
    slopes = bloom_slopes(H) if opts["alibi"] else None
    y = score_mod_attention(q, k, v, scale=opts["scale"], softcap=opts["softcap"], alibi=slopes)
    ref = reference(q, k, v, causal, scale=opts["scale"], softcap=opts["softcap"], slopes=slopes)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-6)


def test_softcap_bounds_the_scores_and_a_huge_cap_changes_nothing():
    q, k, v = _qkv(1, 2, 2, 6, 4)
    q = q * 100  # scores far beyond the cap
    near = score_mod_attention(q, k, v, softcap=1e4)
    torch.testing.assert_close(near, score_mod_attention(q, k, v), atol=1e-4, rtol=1e-4)
    capped = score_mod_attention(q, k, v, softcap=0.5)
    ref = reference(q, k, v, causal, softcap=0.5)
    torch.testing.assert_close(capped, ref)
    assert not torch.allclose(capped, near, atol=1e-3)  # the cap is in effect


def _pattern(tmp_path, fields, const, **att):
    spec = tiny_spec("sp", vocab_size=53, context_length=48, d_model=32,
                     attention={"n_heads": 4, "n_kv_heads": 2, "sparsity": fields, **att})
    return getattr(generate(spec, out_dir=tmp_path).module, const)


def _visible(pattern):
    return lambda i, j: bool(pattern.mask_mod(None, None, torch.tensor(i), torch.tensor(j)))


@pytest.mark.parametrize("fields,const", [WINDOW, GLOBAL_LOCAL, BLOCK], ids=["window", "global_local", "block"])
@pytest.mark.parametrize("opts", [{"softcap": 0.7}, {"scale": 0.3}, {"alibi": True},
                                  {"softcap": 2.0, "scale": 1.5, "alibi": True}], ids=["cap", "scale", "alibi", "all"])
def test_blockwise_path_forward_and_backward_equal_the_float64_reference(fields, const, opts, tmp_path):
    pattern = _pattern(tmp_path, fields, const)
    T = 21  # several chunks, a ragged last one
    q, k, v = (t.requires_grad_() for t in _qkv(2, 4, 2, T, 8))
    slopes = bloom_slopes(4).double() if opts.get("alibi") else None
    kw = dict(scale=opts.get("scale"), softcap=opts.get("softcap"))
    y = sparse.blockwise_attention(q, k, v, pattern, 0.0, alibi=slopes, **kw)
    ref = reference(q, k, v, _visible(pattern), slopes=slopes, **kw)
    torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v), dy)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dy)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("opts", [{"softcap": 0.7}, {"alibi": True}, {"softcap": 3.0, "scale": 0.2, "alibi": True}],
                         ids=["cap", "alibi", "all"])
def test_flex_attention_score_mod_equals_the_reference(opts, tmp_path):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    fields, const = WINDOW
    pattern = _pattern(tmp_path, fields, const)
    T = 19
    q, k, v = _qkv(1, 4, 2, T, 8, dtype=torch.float32)
    slopes = bloom_slopes(4) if opts.get("alibi") else None
    mask = sparse.flex_block_mask(pattern, T, torch.device("cpu"))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        y = flex_attention(q, k, v, score_mod=sparse.flex_score_mod(opts.get("softcap"), slopes), block_mask=mask,
                           scale=opts.get("scale"), enable_gqa=True)
    ref = reference(q, k, v, _visible(pattern), scale=opts.get("scale"), softcap=opts.get("softcap"), slopes=slopes)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    assert sparse.flex_score_mod(None, None) is None  # nothing to modify: no score_mod at all
    # one function object per setting: the compiled flex_attention guards on it (a new one would recompile)
    same = None if slopes is None else slopes.clone()
    assert sparse.flex_score_mod(opts.get("softcap"), slopes) is sparse.flex_score_mod(opts.get("softcap"), same)
    assert sparse.flex_score_mod(9.0, slopes) is not sparse.flex_score_mod(opts.get("softcap"), slopes)


# ── generated models: cached == full, every path ───────────────────────────────────────────────────────────────


def _model(tmp_path, **attention):
    heads = {} if attention.get("kind") == "mla" else {"n_heads": 4, "n_kv_heads": 2}
    spec = tiny_spec("capped", vocab_size=61, context_length=24, d_model=32, n_layers=2,
                     attention={**heads, **attention})
    torch.manual_seed(0)
    return generate(spec, out_dir=tmp_path)


MLA = {"kind": "mla", "n_heads": 2, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
       "v_head_dim": 6}


@pytest.mark.parametrize("attention", [
    {"softcap": 0.5}, {"scale": 0.2}, {"softcap": 1.5, "scale": 0.7},
    {"softcap": 0.5, "sparsity": WINDOW[0]}, {"softcap": 0.5, "scale": 2.0, "sparsity": GLOBAL_LOCAL[0]},
    {"softcap": 0.5, "sparsity": BLOCK[0]},
    {**MLA, "softcap": 0.5}, {**MLA, "softcap": 0.5, "scale": 0.3, "sparsity": WINDOW[0]},
], ids=["dense-cap", "dense-scale", "dense-both", "window", "global_local", "block", "mla", "mla-window"])
def test_cached_decode_equals_the_full_forward_with_modified_scores(attention, tmp_path):
    gen = _model(tmp_path, **attention)
    model = gen.Model().eval()
    with torch.no_grad():  # the cap has to matter: a model without it differs
        for block in model.blocks:
            block.attn.o_proj.weight.mul_(10)
    assert_cached_pieces_match_full_forward(model, 61, 24)
    assert "ATTN_SOFTCAP = " in gen.source or "ATTN_SCALE = " in gen.source


def test_the_file_names_its_constants_and_takes_the_manual_path_only_when_capping(tmp_path):
    capped = _model(tmp_path, softcap=30.0, scale=0.125).source
    assert "ATTN_SOFTCAP = 30.0" in capped and "ATTN_SCALE = 0.125" in capped
    assert "score_mod_attention(" in capped and "softcap=ATTN_SOFTCAP" in capped and "scale=ATTN_SCALE" in capped
    assert "def score_mod_attention" not in capped  # the kernel is the runtime's
    scaled = _model(tmp_path / "s", scale=0.125).source
    assert "score_mod_attention" not in scaled and "scale=ATTN_SCALE" in scaled and "is_causal=not start" in scaled
    plain = _model(tmp_path / "p").source
    assert "ATTN_" not in plain and "score_mod_attention" not in plain


def test_a_capped_model_differs_from_an_uncapped_one_and_scale_changes_it(tmp_path):
    idx = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(1))
    outs = []
    for i, att in enumerate([{}, {"softcap": 0.2}, {"scale": 3.0}]):
        model = _model(tmp_path / str(i), **att).Model().eval()
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkv_proj.weight.mul_(20)
            outs.append(model(idx))
    assert not torch.allclose(outs[0], outs[1], atol=1e-4) and not torch.allclose(outs[0], outs[2], atol=1e-4)


# ── hostile values ─────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("field,value", [("softcap", "0"), ("softcap", "-1.5"), ("softcap", ".nan"),
                                         ("softcap", ".inf"), ("softcap", "-.inf"), ("softcap", "true"),
                                         ("softcap", "1e9"), ("scale", "0"), ("scale", "-0.1"), ("scale", ".nan"),
                                         ("scale", ".inf")])
def test_hostile_softcap_and_scale_exit_2_naming_the_field(field, value, capsys, tmp_path):
    code = main(["build", "specs/llama-like-tiny.yaml", "--out", str(tmp_path), "--set",
                 f"model.attention.{field}={value}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    problems = error_problems(err)
    assert len(problems) == 1 and problems[0].startswith(f"model.attention.{field}: "), err


def test_the_memory_plan_counts_the_materialised_scores_of_the_manual_path_only():
    from archspec.memory import _mixer_saved as _attention_saved  # the layer's token mixer: attention here

    plain = tiny_spec("m", attention={"n_heads": 4})
    capped = tiny_spec("m", attention={"n_heads": 4, "softcap": 5.0})
    window = tiny_spec("m", attention={"n_heads": 4, "softcap": 5.0, "sparsity": WINDOW[0]})
    T = 16
    assert _attention_saved(capped.model, T, 4, "cuda") > _attention_saved(plain.model, T, 4, "cuda")
    assert _attention_saved(capped.model, T, 4, "cuda") >= 4 * T * (3 * 4 + 4)  # rows of T scores per head
    assert _attention_saved(window.model, T, 4, "cpu") == _attention_saved(
        tiny_spec("m", attention={"n_heads": 4, "sparsity": WINDOW[0]}).model, T, 4, "cpu")


def test_a_layer_group_may_cap_its_layers_alone(tmp_path):
    spec = tiny_spec("pl", vocab_size=61, context_length=24, d_model=32, n_layers=3,
                     attention={"n_heads": 4, "n_kv_heads": 2},
                     layers={"capped": {"select": [1], "attention": {"softcap": 0.5, "scale": 0.4}}})
    assert [b.attention.softcap for b in spec.model.blocks()] == [None, 0.5, None]
    gen = generate(spec, out_dir=tmp_path)
    assert gen.source.count("score_mod_attention(") == 1 and "ATTN_SOFTCAP = 0.5" in gen.source
    torch.manual_seed(0)
    model = gen.Model().eval()
    with torch.no_grad():
        model.blocks[1].attn.qkv_proj.weight.mul_(10)
    assert_cached_pieces_match_full_forward(model, 61, 24)
