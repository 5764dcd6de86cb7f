"""Attention sinks (gpt-oss, issue 47): a learned logit per query head that joins each softmax's denominator as a
column with no value. On every attention path — the dense manual path (score_mod_attention), the sparse blockwise
Function (forward and backward, the sinks' own gradient included), FlexAttention (forward, eager on CPU), the rolling
and the dense KV-cached decode, gqa and mla — against one float64 reference that appends the extra column."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.codegen import generate
from archspec.runtime import sparse
from archspec.runtime.scores import score_mod_attention
from archspec.spec import load_spec_dict, model_hash
from tests.test_generation import assert_cached_pieces_match_full_forward
from tests.tiny import tiny_spec

WINDOW = ({"kind": "sliding_window", "window": 5}, "SLIDING_WINDOW")
GLOBAL_LOCAL = ({"kind": "global_local", "window": 4, "n_global": 3}, "GLOBAL_LOCAL")
BLOCK = ({"kind": "block_sparse", "block_size": 4, "n_blocks_back": 1}, "BLOCK_SPARSE")


def reference(q, k, v, visible, sinks, *, scale=None, softcap=None):
    """float64: s = scale · q·k, capped, masked; then the softmax over [s_0 .. s_{T-1}, sink_h], the sink's column
    dropped (it has no value)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, T, D = q.shape
    G = H // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = q @ k.transpose(-1, -2) * (D**-0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    mask = torch.tensor([[visible(a, b) for b in range(T)] for a in range(T)])
    s = s.masked_fill(~mask, float("-inf"))
    column = sinks.double().view(1, H, 1, 1).expand(B, H, T, 1)
    return torch.cat([s, column], dim=-1).softmax(-1)[..., :-1] @ v


def causal(i, j):
    return j <= i


def _qkv(B, H, H_kv, T, D, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g, dtype=dtype) * 2, torch.randn(B, H_kv, T, D, generator=g, dtype=dtype) * 2,
            torch.randn(B, H_kv, T, D, generator=g, dtype=dtype), torch.randn(H, generator=g, dtype=dtype) * 3)


@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([(1, 1), (4, 2), (3, 1), (6, 6)]), T=st.integers(1, 9),
       softcap=st.one_of(st.none(), st.floats(0.1, 50.0)), scale=st.one_of(st.none(), st.floats(0.05, 2.0)))
def test_dense_path_equals_the_reference_with_the_extra_column(heads, T, softcap, scale):
    H, H_kv = heads
    q, k, v, sinks = _qkv(2, H, H_kv, T, 4)
    y = score_mod_attention(q, k, v, scale=scale, softcap=softcap, sinks=sinks)
    # the dense path softmaxes in fp32: scores up to ~50 (softcap) carry a rounding of 50 · 6e-8 into exp, so up to
    # ~1e-5 relative (7.6e-6 drawn); a sink left out or misplaced differs by far more (the tests below)
    torch.testing.assert_close(y, reference(q, k, v, causal, sinks, scale=scale, softcap=softcap),
                               atol=1e-5, rtol=1e-5)


def test_a_sink_takes_probability_away_and_a_very_low_one_changes_nothing():
    q, k, v, _ = _qkv(1, 2, 2, 6, 4)
    plain = score_mod_attention(q, k, v)
    low = score_mod_attention(q, k, v, sinks=torch.full((2,), -1e4, dtype=torch.float64))
    torch.testing.assert_close(low, plain)
    high = score_mod_attention(q, k, v, sinks=torch.full((2,), 1e4, dtype=torch.float64))
    assert high.abs().max() < 1e-12  # every query attends to the sink: nothing
    assert not torch.allclose(score_mod_attention(q, k, v, sinks=torch.zeros(2, dtype=torch.float64)), plain)


def _pattern(tmp_path, fields, const):
    spec = tiny_spec("sp", vocab_size=53, context_length=48, d_model=32,
                     attention={"n_heads": 4, "n_kv_heads": 2, "sparsity": fields, "sinks": True})
    return getattr(generate(spec, out_dir=tmp_path).module, const)


def _visible(pattern):
    return lambda i, j: bool(pattern.mask_mod(None, None, torch.tensor(i), torch.tensor(j)))


@pytest.mark.parametrize("fields,const", [WINDOW, GLOBAL_LOCAL, BLOCK], ids=["window", "global_local", "block"])
@pytest.mark.parametrize("opts", [{}, {"softcap": 0.7, "scale": 0.3}], ids=["plain", "capped"])
def test_blockwise_path_forward_and_backward_equal_the_reference(fields, const, opts, tmp_path):
    pattern = _pattern(tmp_path, fields, const)
    T = 21  # several chunks, a ragged last one
    q, k, v, sinks = (t.requires_grad_() for t in _qkv(2, 4, 2, T, 8))
    y = sparse.blockwise_attention(q, k, v, pattern, 0.0, sinks=sinks, **opts)
    ref = reference(q, k, v, _visible(pattern), sinks, **opts)
    torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-10)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v, sinks), dy)
    ref_grads = torch.autograd.grad(ref, (q, k, v, sinks), dy)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-9, rtol=1e-9)
    assert grads[-1].abs().sum() > 0  # the sinks learn


def test_flex_path_equals_the_reference(tmp_path):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    fields, const = WINDOW
    pattern = _pattern(tmp_path, fields, const)
    T = 19
    q, k, v, sinks = _qkv(1, 4, 2, T, 8, dtype=torch.float32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        y = sparse.flex_sparse_attention(q, k, v, pattern, sinks=sinks, attention=flex_attention)
    torch.testing.assert_close(y.double(), reference(q, k, v, _visible(pattern), sinks), atol=2e-5, rtol=2e-5)


def _sink_model(tmp_path, attention):
    spec = tiny_spec("sinky", vocab_size=61, context_length=24, d_model=32, n_layers=2,
                     attention={"sinks": True, **attention})
    model = generate(spec, out_dir=tmp_path).module.Model().eval()
    with torch.no_grad():  # sinks start at 0; give each head its own so that a misplaced one shows
        for i, block in enumerate(model.blocks):
            block.attn.sinks.copy_(torch.linspace(-2.0, 3.0, block.attn.sinks.numel()) * (i + 1))
    return model


MLA = {"kind": "mla", "n_heads": 4, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
       "v_head_dim": 8}


@pytest.mark.parametrize("attention", [
    {"n_heads": 4, "n_kv_heads": 2},
    {"n_heads": 4, "n_kv_heads": 2, "sparsity": WINDOW[0]},
    {"n_heads": 4, "n_kv_heads": 1, "sparsity": GLOBAL_LOCAL[0], "softcap": 5.0},
    MLA, {**MLA, "sparsity": WINDOW[0]},
], ids=["gqa-dense", "gqa-window", "gqa-global-local-capped", "mla-dense", "mla-window"])
def test_cached_decode_equals_the_full_forward_with_sinks(attention, tmp_path):
    model = _sink_model(tmp_path, attention)
    assert_cached_pieces_match_full_forward(model, 61, 24)


@pytest.mark.parametrize("attention", [{"n_heads": 4, "n_kv_heads": 2}, {"n_heads": 4, "sparsity": WINDOW[0]}, MLA],
                         ids=["gqa-dense", "gqa-window", "mla"])
def test_the_model_applies_its_sinks_and_learns_them(attention, tmp_path):
    model = _sink_model(tmp_path, attention)
    idx = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(1))
    logits, loss = model(idx, idx)
    loss.backward()
    assert all(b.attn.sinks.grad.abs().sum() > 0 for b in model.blocks)
    with torch.no_grad():
        for b in model.blocks:
            b.attn.sinks.fill_(-1e4)  # no sink: the model without them
        off = model(idx)
    assert not torch.allclose(logits.detach(), off, atol=1e-4)


def test_sinks_off_keeps_hashes_keys_and_the_file_and_on_adds_one_parameter_per_head(tmp_path):
    base = {"vocab_size": 61, "context_length": 24, "d_model": 32, "n_layers": 2,
            "attention": {"n_heads": 4, "n_kv_heads": 2}}
    plain = load_spec_dict({"name": "p", "model": base})
    off = load_spec_dict({"name": "p", "model": {**base, "attention": {**base["attention"], "sinks": False}}})
    on = load_spec_dict({"name": "p", "model": {**base, "attention": {**base["attention"], "sinks": True}}})
    assert model_hash(plain) == model_hash(off) != model_hash(on)
    a, b = generate(plain, out_dir=tmp_path / "a"), generate(on, out_dir=tmp_path / "b")
    keys_a, keys_b = set(a.module.Model().state_dict()), set(b.module.Model().state_dict())
    assert keys_b - keys_a == {"blocks.0.attn.sinks", "blocks.1.attn.sinks"} and keys_a <= keys_b
    from archspec.accounting import account
    assert account(on).total - account(plain).total == 2 * 4
    assert sum(p.numel() for p in b.module.Model().parameters()) == account(on).total
    assert "sinks=self.sinks" in b.path.read_text() and "sinks" not in a.path.read_text()


@pytest.mark.parametrize("field,value", [("sinks", "maybe"), ("sinks", "3")])
def test_a_bad_sinks_value_exits_2_naming_the_field(field, value, capsys, tmp_path):
    rc = main(["build", "specs/llama-like-tiny.yaml", "--set", f"model.attention.{field}={value}",
               "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "model.attention.sinks" in err and "Traceback" not in err


def test_sinks_on_a_mixer_without_attention_scores_exits_2_naming_the_field(capsys, tmp_path):
    rc = main(["build", "specs/lfm2-like-tiny.yaml", "--set", "model.layers.conv.mixer.sinks=true",
               "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "sinks" in err and "Traceback" not in err


def test_tensor_parallelism_refuses_sinks_by_name(capsys, tmp_path):
    rc = main(["build", "specs/llama-like-tiny.yaml", "--set", "model.attention.sinks=true", "--set",
               "train.parallel={kind: fsdp, tp: 2}", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "sinks" in err and "Traceback" not in err
