"""Gated DeltaNet (issue 45): the chunked training form equals the step-by-step recurrence in float64 over drawn shapes,
chunk sizes and lengths; the generated layer's accounting (params = numel, FLOPs = FlopCounterMode with the triangular
solves priced by their shapes, state bytes = the cache's nbytes, constant in the context); cached decoding == the full
forward, greedy == recompute, speculative decoding takes the state back; bad shapes exit 2 naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from archspec.accounting import account, kv_cache_bytes
from archspec.cli import main
from archspec.codegen import generate
from archspec.runtime.linear_attention import (DeltaRuleCache, gated_delta_rule_chunked, gated_delta_rule_recurrent,
                                               l2_normalize)
from archspec.spec import SpecError, load_spec_dict
from archspec.testing.assertions import (assert_greedy_generation_is_argmax_of_full_forwards,
                                         assert_rollback_matches_full_forward)

BASE = {"vocab_size": 61, "context_length": 24, "d_model": 32, "n_layers": 4}
GDN = {"kind": "gated_deltanet", "n_heads": 4, "n_k_heads": 2, "head_k_dim": 8, "head_v_dim": 6, "chunk_size": 5}
GDN_ONLY = {**BASE, "mixer": GDN}
HYBRID = {**BASE, "attention": {"n_heads": 4, "n_kv_heads": 2, "output_gate": True},
          "layers": {"gdn": {"select": [0, 1, 2], "mixer": GDN}}}
CASES = {"gdn-only": GDN_ONLY, "hybrid": HYBRID}


def _spec(model: dict):
    return load_spec_dict({"name": "gdn", "model": model})


def _model(model: dict, seed: int = 0):
    spec = _spec(model)
    torch.manual_seed(seed)
    return spec, generate(spec, write=False).Model().eval()


def _inputs(B, T, H, DK, DV, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    q = l2_normalize(r(B, T, H, DK)) / DK ** 0.5
    k = l2_normalize(r(B, T, H, DK))
    g = -torch.nn.functional.softplus(r(B, T, H)) * torch.rand(B, T, H, generator=gen, dtype=dtype) * 3  # log α ≤ 0
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    return q, k, r(B, T, H, DV), g, beta, r(B, H, DK, DV)


# ── the kernel ───────────────────────────────────────────────────────────────────────────────────────────────────


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 2), T=st.integers(1, 40), H=st.integers(1, 3), DK=st.integers(1, 7), DV=st.integers(1, 7),
       C=st.integers(1, 17), with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_the_chunked_form_equals_the_recurrence_in_float64(B, T, H, DK, DV, C, with_state, seed):
    q, k, v, g, beta, s0 = _inputs(B, T, H, DK, DV, seed)
    s0 = s0 if with_state else None
    o_ref, s_ref = gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    o, s = gated_delta_rule_chunked(q, k, v, g, beta, C, s0)
    assert o.dtype == torch.float64 and s.dtype == torch.float64
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=1e-10)


def test_the_chunked_form_continues_a_state_and_has_gradients():
    """Two halves from the carried state equal the whole, and backward reaches every input (training)."""
    q, k, v, g, beta, _ = _inputs(1, 23, 2, 4, 3, seed=1)
    whole, s_whole = gated_delta_rule_chunked(q, k, v, g, beta, 4)
    a, s_a = gated_delta_rule_chunked(q[:, :9], k[:, :9], v[:, :9], g[:, :9], beta[:, :9], 4)
    b, s_b = gated_delta_rule_chunked(q[:, 9:], k[:, 9:], v[:, 9:], g[:, 9:], beta[:, 9:], 7, s_a)
    torch.testing.assert_close(torch.cat([a, b], 1), whole)
    torch.testing.assert_close(s_b, s_whole)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
    out, _ = gated_delta_rule_chunked(*leaves, 4)
    out.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in leaves)
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_rule_chunked(q, k, v, g, beta, 0)


def _solve_flops(a_shape, b_shape, *args, **kwargs) -> int:
    """A unit-triangular solve of (…, C, C) against (…, C, N): C·(C − 1)/2 multiply-adds per right-hand column."""
    C, N = a_shape[-1], b_shape[-1]
    batch = 1
    for s in b_shape[:-2]:
        batch *= s
    return batch * C * (C - 1) * N


def _count(fn) -> int:
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.linalg_solve_triangular: _solve_flops})
    with torch.no_grad(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), counter:
        fn()
    return counter.get_total_flops()


# ── the generated layer: accounting ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("case", list(CASES))
def test_params_and_state_bytes_equal_the_generated_module_and_do_not_grow(case):
    spec, model = _model(CASES[case])
    acc = account(spec)
    named = dict(model.named_parameters())
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.by_component["linear_attention"] == sum(p.numel() for n, p in named.items() if ".linear_attn." in n)
    gdn = next(b.token_mixer for b in spec.model.blocks() if b.token_mixer.kind == "gated_deltanet")
    assert gdn.state_bytes_per_token(spec.model, 2) == 0
    sizes = set()
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for T in (1, 7, spec.model.context_length):
            cache = model.new_cache(2, T, dtype=dtype)
            assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, T, name, 2)
            sizes.add(gdn.state_bytes_per_sequence(spec.model, T, 2))
    assert len(sizes) == 1  # whatever the context


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("T", [24, 13])  # a whole number of chunks (5 does not divide 24 either: padded) and not
def test_forward_flops_match_flop_counter(case, T):
    spec, model = _model(CASES[case])
    idx = torch.randint(0, spec.model.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    counted = _count(lambda: model(idx))
    expected = _expected_flops(spec, T)
    assert abs(counted - expected) <= 10 * T, (counted, expected)  # the accounting rounds each column per token
    gdn = next(b.token_mixer for b in spec.model.blocks() if b.token_mixer.kind == "gated_deltanet")
    assert account(spec).flops_by_component["linear_attention"] > gdn.scan_flops(T) > 0


def _expected_flops(spec, T: int) -> float:
    """Forward FLOPs of the whole model over T positions, from the units' own accounting at length T."""
    from archspec.accounting import flops_breakdown

    return float(sum(flops_breakdown(spec.model, T, full_attention=True).values()) * T)


def test_the_scan_flops_are_the_counted_ones_over_drawn_shapes():
    """The kernel alone, at shapes and lengths the model tests do not reach: counted == GatedDeltaNetSpec.scan_flops."""
    from archspec.kinds.mixer import GatedDeltaNetSpec

    for (H, DK, DV, C, T) in [(1, 3, 5, 4, 1), (2, 4, 4, 8, 8), (3, 2, 7, 16, 33), (2, 8, 3, 1, 6)]:
        q, k, v, g, beta, _ = _inputs(1, T, H, DK, DV, seed=T, dtype=torch.float32)
        unit = GatedDeltaNetSpec(n_heads=H, n_k_heads=H, head_k_dim=DK, head_v_dim=DV, chunk_size=C)
        assert _count(lambda: gated_delta_rule_chunked(q, k, v, g, beta, C)) == unit.scan_flops(T) * T


def test_the_memory_plan_counts_the_chunked_activations():
    """saved_bytes grows with the chunk (its C × C tiles) and stays within 2× of what autograd keeps per token
    (measured: the storages saved for backward, at two lengths, the difference per token)."""
    spec, model = _model(GDN_ONLY)
    unit = spec.model.mixer
    wide = unit.model_copy(update={"chunk_size": 16})
    assert wide.saved_bytes(spec.model, 64, 4, "cpu") > unit.saved_bytes(spec.model, 64, 4, "cpu")
    layer = model.blocks[0].linear_attn.train()

    def saved(T: int) -> int:
        seen: dict[int, int] = {}

        def pack(t):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
            return t

        x = torch.randn(2, T, 32, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x).sum()
        return sum(seen.values())

    per_token = (saved(200) - saved(100)) / (2 * 100)
    said = unit.saved_bytes(spec.model, 200, 4, "cpu")
    assert per_token / 2 <= said <= 2 * per_token, (said, per_token)


# ── the generated layer: decoding ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("case", list(CASES))
def test_cached_decoding_equals_the_full_forward(case):
    spec, model = _model(CASES[case], seed=1)
    idx = torch.randint(0, spec.model.vocab_size, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 24, dtype=torch.float32)
        steps = [model(idx[:, :6], cache=cache), model(idx[:, 6:9], cache=cache)]  # a prefill, then a chunk
        steps += [model(idx[:, t : t + 1], cache=cache) for t in range(9, 20)]  # then one position at a time
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert all(c.length == 20 for c in cache)
    assert any(isinstance(c, DeltaRuleCache) for c in cache)


def test_the_delta_rule_state_takes_back_rejected_positions():
    assert_rollback_matches_full_forward(_model(GDN_ONLY, seed=3)[1], 61)


def test_greedy_generation_equals_argmax_of_full_forwards():
    assert_greedy_generation_is_argmax_of_full_forwards(_model(HYBRID, seed=5)[1], 61)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_decoding_through_delta_rule_states_is_the_target_greedy(k):
    from archspec.sample import SpeculativeStats, speculative_stream

    _, target = _model({**HYBRID, "tie_embeddings": False}, seed=8)
    _, draft = _model({**GDN_ONLY, "tie_embeddings": False}, seed=9)
    prompt = torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(10))
    stats = SpeculativeStats()
    got = list(speculative_stream(target, draft, prompt, 14, k=k, stats=stats))
    assert got == target.generate(prompt, max_new_tokens=14, temperature=0)[0, 5:].tolist()
    assert stats.drafted > stats.accepted  # drafts were rejected, so states were taken back


def test_the_decay_starts_near_one_so_the_state_remembers_past_a_few_positions():
    """At init (a zero input to the gate), α = exp(−exp(A_log)·softplus(dt_bias)) per head. The Gated DeltaNet paper's
    init (dt log-uniform in [1e-3, 0.1], A ~ U(0, 16)) starts α near 1; transformers' Qwen3-Next init (dt_bias = 1,
    A ~ U(1, 16) here) started every head at α ≤ 0.27, a memory of a position or two, and GDN-only models trained from
    it stayed at chance on MQAR (docs/mixers.md)."""
    _, model = _model({**BASE, "mixer": {**GDN, "n_heads": 64, "n_k_heads": 8, "head_k_dim": 4, "head_v_dim": 4}})
    alphas = torch.cat([torch.exp(-b.linear_attn.A_log.exp() * torch.nn.functional.softplus(b.linear_attn.dt_bias))
                        for b in model.blocks]).detach()
    assert ((alphas > 0) & (alphas < 1)).all()
    assert alphas.median() > 0.7, alphas  # half the heads keep > 0.7 of S per position: 0.7¹⁰ ≈ 3% after 10
    assert (alphas > 0.95).float().mean() > 0.2, alphas  # and some keep it over tens of positions


# ── the spec ────────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("model,field", [
    ({**BASE, "mixer": {**GDN, "n_k_heads": 3}}, "model.mixer.n_k_heads"),
    ({**BASE, "mixer": {**GDN, "head_k_dim": 0}}, "model.mixer.head_k_dim"),
    ({**BASE, "mixer": {**GDN, "head_v_dim": 0}}, "model.mixer.head_v_dim"),
    ({**BASE, "mixer": {**GDN, "chunk_size": 0}}, "model.mixer.chunk_size"),
    ({**BASE, "mixer": {**GDN, "chunk_size": -4}}, "model.mixer.chunk_size"),
    ({**BASE, "mixer": {"kind": "gated_deltanet", "n_heads": 3}}, "model.mixer.n_k_heads"),
    ({**BASE, "mixer": {**GDN, "conv_kernel": 1}}, "model.mixer.conv_kernel"),
    ({**HYBRID, "layers": {"g": {"select": [0], "mixer": {**GDN, "n_heads": 0}}}}, "model.layers.g.mixer.n_heads"),
    ({**BASE, "mixer": {**GDN, "positional": {"kind": "rope"}}}, "model.mixer.positional"),
], ids=["heads-not-dividing", "key-dim-0", "value-dim-0", "chunk-0", "chunk-negative", "heads-not-dividing-d_model",
        "conv-1", "heads-0-in-group", "positional-under-gdn"])
def test_bad_shapes_exit_2_naming_the_field(model, field, tmp_path, capsys):
    with pytest.raises(SpecError) as err:
        _spec(model)
    assert any(line.startswith(field) for line in err.value.problems), err.value.problems
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"name": "bad", "model": model}))
    assert main(["build", str(path), "--out", str(tmp_path), "--no-record"]) == 2
    err_text = capsys.readouterr().err
    assert field in err_text and "Traceback" not in err_text


def test_omitted_widths_are_filled_model_wide_and_in_a_group_and_hash_as_written():
    from archspec.spec import model_hash

    for where in ("model", "group"):
        def spell(mixer):
            if where == "model":
                return _spec({**BASE, "mixer": mixer})
            return _spec({**BASE, "attention": {"n_heads": 4}, "layers": {"g": {"select": [0, 1], "mixer": mixer}}})

        short = spell({"kind": "gated_deltanet", "n_heads": 4, "n_k_heads": 2})
        unit = short.model.blocks()[0].token_mixer
        assert (unit.head_k_dim, unit.head_v_dim) == (16, 16)  # d_model 32 over 2 q/k heads; values as wide
        written = spell({"kind": "gated_deltanet", "n_heads": 4, "n_k_heads": 2, "head_k_dim": 16, "head_v_dim": 16})
        assert model_hash(short) == model_hash(written)


def test_tensor_parallelism_is_refused_at_train_parallel_tp_naming_the_layer():
    with pytest.raises(SpecError) as err:
        load_spec_dict({"name": "g", "model": {**HYBRID, "vocab_size": 320},
                        "train": {"parallel": {"kind": "fsdp", "tp": 2}}})
    assert any(p.startswith("train.parallel.tp") and "model.layers.gdn.mixer" in p and "gated_deltanet" in p
               for p in err.value.problems), err.value.problems
