"""Multi-head latent attention (the attention family's `mla` kind): its cache holds the latent and the rope key only
and the accounting says so for every kind; generation through it equals a full forward; it mixes with the default
kind per layer; old specs (no attention.kind) keep their hashes; its rules name their fields."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec import testing as T
from archspec.accounting import account, kv_cache_bytes
from archspec.codegen import generate
from archspec.runtime import SparsePattern, sparse_attention
from archspec.spec import SpecError, load_spec_dict, model_hash

VOCAB, CONTEXT, D = 61, 24, 32
MLA = {"kind": "mla", "n_heads": 4, "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
       "v_head_dim": 6}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spec(attention=None, **model):
    body = {"vocab_size": VOCAB, "context_length": CONTEXT, "d_model": D, "n_layers": 2,
            "attention": attention if "kind" in (attention or {}) else {**MLA, **(attention or {})}, **model}
    return load_spec_dict({"name": "mla", "model": body})


def _model(spec, gen_dir, seed=0):
    torch.manual_seed(seed)
    return generate(spec, out_dir=gen_dir).Model().eval()


def _pieces_equal_full_forward(model, vocab, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (2, length), generator=g)
    prefill = max(1, length // 3)
    cuts = [0, prefill, min(length, prefill + 3), *range(min(length, prefill + 3) + 1, length + 1)]
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, length)
        pieces = [model(idx[:, a:b], cache=cache) for a, b in zip(cuts, cuts[1:]) if b > a]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=1e-5)


# ── the cache: what it holds, and the accounting of every kind ──────────────────────────────────────────────────


@settings(max_examples=15, deadline=None)
@given(spec=T.valid_specs(train=False, max_layers=3, min_context=2, max_context=20))
def test_accounted_kv_bytes_are_what_new_cache_allocates_for_every_kind(spec, gen_dir):
    model = _model(spec, gen_dir)
    m = spec.model
    assert sum(c.nbytes for c in model.new_cache(2, m.context_length)) == kv_cache_bytes(m, m.context_length, "fp32", 2)
    assert sum(c.nbytes for c in model.new_cache(1)) == account(spec, kv_dtype="fp32").kv_cache_bytes_per_sequence


def test_mla_caches_the_latent_and_the_rope_key_only(gen_dir):
    spec = _spec()
    cache = _model(spec, gen_dir).new_cache(3, 20)
    assert cache[0].latent.shape == (3, 20, 12) and cache[0].k_pe.shape == (3, 1, 20, 4)
    per_token = 2 * (12 + 4)  # 2 layers × (kv_lora_rank + qk_rope_head_dim), whatever the head count
    assert account(spec, kv_dtype="fp32").kv_cache_bytes_per_token == per_token * 4
    mha = _spec({"kind": "gqa", "n_heads": 4, "n_kv_heads": 4, "head_dim": 8})
    assert account(mha, kv_dtype="fp32").kv_cache_bytes_per_token == 2 * 2 * 4 * 8 * 4
    window = _spec({"sparsity": {"kind": "sliding_window", "window": 5}})
    cache = _model(window, gen_dir).new_cache(1, 20)
    assert cache[0].k.shape[2] == 5 and sum(c.nbytes for c in cache) == kv_cache_bytes(window.model, 20, "fp32")


# ── generation ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("sparsity", [{"kind": "dense"}, {"kind": "sliding_window", "window": 5},
                                      {"kind": "global_local", "window": 4, "n_global": 2},
                                      {"kind": "block_sparse", "block_size": 4, "n_blocks_back": 1}],
                         ids=lambda s: s["kind"])
@pytest.mark.parametrize("q_lora_rank", [None, 10])
@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_cached_pieces_equal_one_full_forward(sparsity, q_lora_rank, positional, gen_dir):
    spec = _spec({"sparsity": sparsity, "q_lora_rank": q_lora_rank, "positional": {"kind": positional}})
    _pieces_equal_full_forward(_model(spec, gen_dir), VOCAB, CONTEXT)


@pytest.mark.parametrize("sparsity", [{"kind": "dense"}, {"kind": "sliding_window", "window": 6}], ids=str)
def test_greedy_generation_with_the_cache_equals_recomputing_every_step(sparsity, gen_dir):
    model = _model(_spec({"sparsity": sparsity, "q_lora_rank": 10}), gen_dir, seed=3)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, 15, temperature=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(15):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_a_windowed_mla_model_generates_past_its_context(gen_dir):
    spec = _spec({"sparsity": {"kind": "sliding_window", "window": 6}})
    model = _model(spec, gen_dir)
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    assert model.generate(prompt, CONTEXT + 6, temperature=0).shape == (1, 4 + CONTEXT + 6)


# ── per-layer: mla beside the default kind ───────────────────────────────────────────────────────────────────────


def test_mla_and_gqa_layers_in_one_model(gen_dir):
    spec = _spec(n_layers=3, layers={"std": {"select": [1], "attention": {"kind": "gqa", "n_heads": 2,
                                                                           "n_kv_heads": 1, "head_dim": 4}}})
    assert [b.attention.kind for b in spec.model.blocks()] == ["mla", "gqa", "mla"]
    model = _model(spec, gen_dir)
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    _pieces_equal_full_forward(model, VOCAB, CONTEXT)
    assert sum(c.nbytes for c in model.new_cache(1, 10)) == kv_cache_bytes(spec.model, 10, "fp32")
    # the canonical form says each layer's kind, so it loads back to the same model
    again = load_spec_dict({"name": "x", "model": spec.model.model_dump(mode="json")})
    assert model_hash(again) == model_hash(spec)


def test_rope_needs_one_rotated_width_across_kinds():
    with pytest.raises(SpecError) as info:
        _spec(layers={"std": {"select": [1], "attention": {"kind": "gqa", "n_heads": 2, "head_dim": 8}}})
    assert [p for p in info.value.problems if p.startswith("model.layers: every layer must have one head_dim")]


# ── identity and rules ───────────────────────────────────────────────────────────────────────────────────────────


def test_the_default_kind_written_or_omitted_is_one_model():
    body = {"vocab_size": VOCAB, "context_length": CONTEXT, "d_model": D, "attention": {"n_heads": 4}}
    omitted = load_spec_dict({"name": "a", "model": body})
    written = load_spec_dict({"name": "a", "model": {**body, "attention": {"kind": "gqa", "n_heads": 4}}})
    assert model_hash(omitted) == model_hash(written)
    assert model_hash(_spec()) != model_hash(_spec({"kv_lora_rank": 13}))


@pytest.mark.parametrize("attention,path", [
    ({"qk_rope_head_dim": 5}, "model.attention.qk_rope_head_dim"),  # rope rotates pairs
    ({"n_heads": 64, "qk_nope_head_dim": 8}, "model.attention.qk_nope_head_dim"),  # 64·12 > 8·32
    ({"v_head_dim": 300}, "model.attention.v_head_dim"),
    ({"n_kv_heads": 2}, "model.attention.n_kv_heads"),  # not an mla field
])
def test_rules_name_the_field(attention, path):
    with pytest.raises(SpecError) as info:
        _spec(attention)
    assert any(p.startswith(path) for p in info.value.problems), info.value.problems


# ── the blockwise kernel with values of their own width ────────────────────────────────────────────────────────


@pytest.mark.parametrize("dv", [3, 8, 13])
def test_blockwise_attention_with_another_value_width_equals_masked_sdpa(dv):
    def window(b, h, q, k):
        return (k <= q) & (q - k < 5)

    pattern = SparsePattern(window, n_global=0, lookback=4, chunk=4, reach=5)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 4, 11, 8, generator=g, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 4, 11, dv, generator=g, requires_grad=True)
    y = sparse_attention(q, k, v, pattern)
    pos = torch.arange(11)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=window(None, None, pos[:, None], pos[None, :]))
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(y.square().sum(), (q, k, v))
    expected = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_set_attention_kind_starts_the_section_from_that_kinds_defaults():
    from archspec.spec import apply_overrides

    data = {"name": "t", "model": {"d_model": D, "attention": {"n_heads": 4, "n_kv_heads": 2}}}  # kind omitted: gqa
    apply_overrides(data, ["model.attention.kind=mla", "model.attention.kv_lora_rank=8"])
    assert data["model"]["attention"] == {"kind": "mla", "kv_lora_rank": 8}
    apply_overrides(data, ["model.attention.kind=mla", "model.attention.v_head_dim=4"])  # the same kind: refined
    assert data["model"]["attention"] == {"kind": "mla", "kv_lora_rank": 8, "v_head_dim": 4}


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), d_model=st.integers(1, 64), rotary_width=st.one_of(st.none(), st.integers(1, 16)))
def test_the_mla_strategy_draws_only_what_its_rules_accept(data, d_model, rotary_width):
    """Any model width, alone or in a layer group whose rotated width the other layers fix: the drawn heads fit
    8·d_model (a whole-spec search once drew 4 heads of 1 + 16 in a model of width 8)."""
    from types import SimpleNamespace

    from archspec.kinds.attention.mla import MLASpec

    ctx = {"d_model": d_model, **({"rotary_width": rotary_width} if rotary_width else {})}
    drawn = MLASpec.model_validate(data.draw(MLASpec.strategy(ctx)))
    assert drawn.problems(SimpleNamespace(d_model=d_model), ("a",)) == []
