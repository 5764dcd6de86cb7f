"""RoPE in a generated module against formulas written here, independently of the template.

Reference (Su et al., 2021, eq. 34 in complex form): the rotated part of a head vector (its first d = int(partial ·
head_dim) dimensions) is read as d/2 complex numbers z_i, pair i being (i, i + d/2) in the "half" layout (LLaMA) or
(2i, 2i + 1) in the "interleaved" one (GPT-J, GLM); position m multiplies z_i by exp(i·m·f_i) with f_i = θ^(-2i/d)
(then rescaled by the spec's scaling), and the rest of the head passes through. yarn's frequencies and attention factor
are transformers' `_compute_yarn_parameters`, rewritten here in float64 from its formulas. Computed in float64 with
Python complex numbers, from the spec alone.
"""

from __future__ import annotations

import cmath
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec import testing as T
from archspec.codegen import generate
from archspec.errors import UserError
from archspec.kinds.positional.rope import yarn_mscale
from archspec.spec import load_spec_dict

CONTEXT = 64


def _spec(head_dim: int, positional: dict):
    n_heads = 2
    return load_spec_dict({"name": "rope-check", "model": {
        "vocab_size": 32, "context_length": CONTEXT, "d_model": n_heads * head_dim, "n_layers": 1,
        "attention": {"n_heads": n_heads, "head_dim": head_dim, "positional": positional},
        "ffn": {"kind": "mlp", "activation": "relu", "hidden_dim": 8},
    }})


def _rope_module(head_dim: int, theta: float = 10000.0, **positional):
    gen = generate(_spec(head_dim, {"kind": "rope", "theta": theta, **positional}), write=False)
    model = gen.Model()

    def rotate(x: torch.Tensor, m: int) -> torch.Tensor:  # x: (head_dim,) at position m, computed past the table too
        cos, sin = model.rope(1, m)
        return gen.module.apply_rope(x.view(1, 1, 1, -1), cos, sin).view(-1)

    return rotate


def _yarn_frequencies(d: int, theta: float, s: dict) -> tuple[list[float], float]:
    """transformers' `_compute_yarn_parameters` in float64: the blended frequencies and the attention factor."""
    factor, original = s["factor"], s["original_context_length"]
    fast, slow = s.get("beta_fast", 32.0), s.get("beta_slow", 1.0)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.get("attention_factor") is not None:
        attention = s["attention_factor"]
    elif s.get("mscale") and s.get("mscale_all_dim"):
        attention = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    else:
        attention = mscale(factor)

    def at(turns):
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = at(fast), at(slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(d // 2):
        f = theta ** (-2 * i / d)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(f / factor * ramp + f * (1 - ramp))
    return out, attention


def _reference(x: list[float], m: int, theta: float, partial: float = 1.0, layout: str = "half",
               scaling: dict | None = None) -> list[float]:
    d = int(partial * len(x))
    half = d // 2
    freqs, attention = [theta ** (-2 * i / d) for i in range(half)], 1.0
    if scaling is not None:  # yarn only here (linear and llama3 are checked against HF in tests/test_hf_*.py)
        freqs, attention = _yarn_frequencies(d, theta, scaling)
    pairs = [(i, i + half) if layout == "half" else (2 * i, 2 * i + 1) for i in range(half)]
    out = list(x)
    for i, (a, b) in enumerate(pairs):
        z = complex(x[a], x[b]) * cmath.exp(1j * m * freqs[i]) * attention
        out[a], out[b] = z.real, z.imag
    return out


head_dims = st.integers(1, 16).map(lambda h: 2 * h)
thetas = st.floats(2.0, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=25, deadline=None)
@given(head_dim=head_dims, theta=thetas, m=st.integers(0, CONTEXT - 1), seed=st.integers(0, 2**16))
def test_rope_matches_the_complex_rotation(head_dim, theta, m, seed):
    rotate = _rope_module(head_dim, theta)
    x = torch.randn(head_dim, generator=torch.Generator().manual_seed(seed))
    expected = torch.tensor(_reference(x.tolist(), m, theta), dtype=torch.float32)
    # fp32 tables: the angle m·θ^(-2i/d) (at most 63 rad) carries ~1e-5 absolute error into cos/sin.
    torch.testing.assert_close(rotate(x, m), expected, atol=5e-5, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(step=st.integers(1, 8), partial=st.sampled_from([1.0, 0.75, 0.5, 0.25]),
       layout=st.sampled_from(["half", "interleaved"]), theta=thetas, m=st.integers(0, 2 * CONTEXT),
       seed=st.integers(0, 2**16))
def test_partial_and_interleaved_rotation_match_the_complex_rotation(step, partial, layout, theta, m, seed):
    """Which dimensions pair with which frequency in each layout; the unrotated rest untouched (bit for bit);
    positions past the table computed alike."""
    head_dim = 8 * step  # int(partial · head_dim) even for these fractions
    rotate = _rope_module(head_dim, theta, partial=partial, layout=layout)
    x = torch.randn(head_dim, generator=torch.Generator().manual_seed(seed))
    got = rotate(x, m)
    expected = torch.tensor(_reference(x.tolist(), m, theta, partial, layout), dtype=torch.float32)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)
    rotated = int(partial * head_dim)
    assert torch.equal(got[rotated:], x[rotated:])


yarns = st.fixed_dictionaries(
    {"kind": st.just("yarn"), "factor": st.floats(1.0, 64.0), "original_context_length": st.integers(4, 4096)},
    optional={"beta_fast": st.floats(8.0, 64.0), "beta_slow": st.floats(0.25, 4.0),
              "mscale": st.floats(0.0, 2.0), "mscale_all_dim": st.floats(0.0, 2.0),
              "attention_factor": st.floats(0.5, 2.0), "truncate": st.booleans()})


@settings(max_examples=30, deadline=None)
@given(step=st.integers(1, 8), scaling=yarns, theta=thetas, layout=st.sampled_from(["half", "interleaved"]),
       partial=st.sampled_from([1.0, 0.5]), m=st.integers(0, CONTEXT - 1), seed=st.integers(0, 2**16))
def test_yarn_matches_transformers_formulas(step, scaling, theta, layout, partial, m, seed):
    head_dim = 4 * step
    rotate = _rope_module(head_dim, theta, partial=partial, layout=layout, scaling=scaling)
    x = torch.randn(head_dim, generator=torch.Generator().manual_seed(seed))
    expected = torch.tensor(_reference(x.tolist(), m, theta, partial, layout, scaling), dtype=torch.float32)
    torch.testing.assert_close(rotate(x, m), expected, atol=2e-4, rtol=1e-4)


def test_yarn_mscale_is_deepseeks():
    """The helper an attention kind (MLA) calls for DeepSeek's softmax scale, read off transformers' own public
    DeepseekV3Attention (its `scaling`, the softmax scale it multiplies the scores by), never a private helper whose
    name moves between releases (5.25 renamed yarn_get_mscale)."""
    hf = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    qk_head_dim = 8 + 8
    for factor in (0.5, 1.0, 4.0, 40.0):
        for mscale_all_dim in (0.707, 1.0, 2.0):
            config = hf.DeepseekV3Config(
                vocab_size=32, hidden_size=32, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None,
                kv_lora_rank=8, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_hidden_layers=1,
                max_position_embeddings=64,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
                                 "original_max_position_embeddings": 16, "mscale": mscale_all_dim,
                                 "mscale_all_dim": mscale_all_dim, "beta_fast": 32, "beta_slow": 1})
            scaling = DeepseekV3Attention(config, 0).scaling
            assert scaling / qk_head_dim ** -0.5 == pytest.approx(yarn_mscale(factor, mscale_all_dim) ** 2, rel=1e-12)
    assert yarn_mscale(40.0) == pytest.approx(1.0 + 0.1 * math.log(40.0))


# ── the class: every rope a spec can draw ──────────────────────────────────────────────────────────────────────


@st.composite
def _drawn_ropes(draw):
    rope = draw(T.positionals(kinds=["rope"]))
    step = type(load_spec_dict({"name": "x", "model": {"vocab_size": 8, "context_length": 8, "d_model": 16,
                                                       "n_layers": 1, "attention": {"n_heads": 2}}})
                .model.attention.positional).head_dim_step(rope)
    head_dim = step * draw(st.integers(1, max(1, 32 // step)))
    return rope, head_dim


@settings(max_examples=40, deadline=None)
@given(drawn=_drawn_ropes(), m=st.integers(0, CONTEXT // 2 - 1), n=st.integers(0, CONTEXT // 2 - 1),
       shift=st.integers(0, CONTEXT), seed=st.integers(0, 2**16))
def test_every_drawn_rope_scales_each_pair_alike_and_scores_depend_only_on_the_offset(drawn, m, n, shift, seed):
    """For every partial, layout and scaling the strategies draw: each rotated pair keeps its length (times yarn's
    attention factor, the same for every pair and position), the passed dimensions are untouched, and q·k at (m, n)
    equals q·k at (m + shift, n + shift), past the table included."""
    rope, head_dim = drawn
    spec = _spec(head_dim, {"kind": "rope", **rope})
    unit = spec.model.attention.positional
    gen = generate(spec, write=False)
    model = gen.Model()

    def rotate(x, pos):
        cos, sin = model.rope(1, pos)
        return gen.module.apply_rope(x.view(1, 1, 1, -1), cos, sin).view(-1).double()

    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    d = unit.rotated_dims(spec.model)
    scale = unit.scaling.attention_scale() if unit.scaling is not None and unit.scaling.kind == "yarn" else 1.0
    pair = (lambda v: v[:d].view(2, d // 2).norm(dim=0)) if unit.layout == "half" else (
        lambda v: v[:d].view(d // 2, 2).norm(dim=1))
    out = rotate(q, m)
    torch.testing.assert_close(pair(out), pair(q.double()) * scale, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[d:].float(), q[d:])
    score, shifted = rotate(q, m) @ rotate(k, n), rotate(q, m + shift) @ rotate(k, n + shift)
    torch.testing.assert_close(shifted, score, atol=2e-4 * scale**2 * head_dim, rtol=1e-4)


@settings(max_examples=15, deadline=None)
@given(head_dim=head_dims, theta=thetas, m=st.integers(0, CONTEXT // 2 - 1), n=st.integers(0, CONTEXT // 2 - 1),
       shift=st.integers(0, CONTEXT // 2), seed=st.integers(0, 2**16))
def test_rope_scores_depend_only_on_the_offset(head_dim, theta, m, n, shift, seed):
    rotate = _rope_module(head_dim, theta)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    score = rotate(q, m) @ rotate(k, n)
    shifted = rotate(q, m + shift) @ rotate(k, n + shift)
    torch.testing.assert_close(shifted, score, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(rotate(q, m).norm(), q.norm(), atol=1e-5, rtol=1e-5)  # a rotation keeps length


# ── the rotated width: transformers' rounding, refused when odd ──────────────────────────────────────────────


@settings(max_examples=60, deadline=None)
@given(head_dim=st.integers(2, 160), partial=st.floats(0.01, 1.0))
def test_the_rotated_width_is_transformers_int_of_the_product_and_odd_ones_are_refused(head_dim, partial):
    want = int(head_dim * partial)  # transformers: dim = int(head_dim * partial_rotary_factor)
    if want % 2 == 0 and want >= 2 and (partial < 1.0 or head_dim % 2 == 0):
        spec = _spec(head_dim, {"kind": "rope", "partial": partial})
        assert spec.model.attention.positional.rotated_dims(spec.model) == want
        return
    with pytest.raises(UserError) as err:
        _spec(head_dim, {"kind": "rope", "partial": partial})
    where = "model.attention.head_dim" if partial == 1.0 else "model.attention.positional.partial"
    assert where in str(err.value) + " ".join(err.value.problems)


def test_the_rotated_width_equals_what_transformers_glm_rotates():
    """GLM's rotary embedding (transformers) on the same head widths and fractions: as many frequencies as ours."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.glm.modeling_glm import GlmRotaryEmbedding

    for head_dim, partial in ((64, 0.5), (40, 0.3), (96, 0.25), (20, 0.7), (128, 0.375), (10, 0.6)):
        config = transformers.GlmConfig(hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=head_dim, partial_rotary_factor=partial, pad_token_id=None)
        theirs = 2 * GlmRotaryEmbedding(config).inv_freq.numel()
        spec = _spec(head_dim, {"kind": "rope", "partial": partial})
        assert spec.model.attention.positional.rotated_dims(spec.model) == theirs, (head_dim, partial)


def test_tables_are_rotary_dim_wide_in_the_accounting_and_the_module():
    from archspec.accounting import account

    spec = _spec(32, {"kind": "rope", "partial": 0.25, "layout": "interleaved"})
    model = generate(spec, write=False).Model()
    assert model.rope.cos.shape == (CONTEXT, 8)
    buffers = sum(b.numel() for _, b in model.named_buffers())
    assert spec.model.attention.positional.buffer_elements(spec.model) == buffers == 2 * CONTEXT * 8
    assert account(spec.model, CONTEXT) is not None


def test_a_fully_rotating_file_keeps_head_dim_and_a_partial_one_names_rotary_dim():
    full = generate(_spec(16, {"kind": "rope"}), write=False).source
    part = generate(_spec(16, {"kind": "rope", "partial": 0.5}), write=False).source
    assert "ROTARY_DIM" not in full and "HEAD_DIM, 2, dtype" in full
    assert "ROTARY_DIM = 8  # int(0.5 · HEAD_DIM)" in part


@pytest.mark.parametrize("positional,path", [
    ({"kind": "rope", "partial": 0.3}, "model.attention.positional.partial"),  # int(0.3 · 16) = 4: fine; see below
    ({"kind": "rope", "scaling": {"kind": "yarn", "beta_fast": 1.0, "beta_slow": 2.0}},
     "model.attention.positional.scaling.beta_fast"),
])
def test_rope_rules_name_the_field(positional, path):
    head_dim = 10 if positional.get("partial") else 16  # int(0.3 · 10) = 3: odd
    with pytest.raises(UserError) as err:
        _spec(head_dim, positional)
    text = str(err.value) + " ".join(err.value.problems)
    assert path in text, text


def test_the_new_fields_through_set_and_schema_and_bad_values_exit_2(tmp_path, capsys):
    import json
    from pathlib import Path

    from archspec.cli import main

    tiny = str(Path(__file__).resolve().parent.parent / "specs" / "llama-like-tiny.yaml")
    sets = ["--set", "model.attention.positional.partial=0.25", "--set", "model.attention.positional.layout=interleaved",
            "--set", "model.attention.positional.scaling={kind: yarn, factor: 4.0, original_context_length: 32}"]
    assert main(["build", tiny, *sets, "--json", "--out", str(tmp_path)]) == 0
    built = json.loads(capsys.readouterr().out)
    source = Path(built["generated"]).read_text()
    assert "ROTARY_DIM = 8" in source and "rotate_pairs" in source and "yarn_scaled" in source
    assert main(["schema"]) == 0
    schema = capsys.readouterr().out
    assert '"partial"' in schema and '"interleaved"' in schema and '"yarn"' in schema
    for value, field in (("0.1", "model.attention.positional.partial"), ("1.5", "model.attention.positional.partial"),
                         ("diagonal", "model.attention.positional.layout")):
        key = field.rsplit(".", 1)[1]
        assert main(["build", tiny, "--set", f"model.attention.positional.{key}={value}", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err, err


def test_the_new_fields_are_filter_keys():
    from archspec.registry.query.fields import resolve_field

    for key in ("partial", "layout", "scaling.beta_fast", "scaling.mscale_all_dim", "scaling.truncate"):
        ref = resolve_field(f"params.model.attention.positional.{key}", "runs")
        assert (ref.kind, ref.key) == ("param", f"model.attention.positional.{key}")


@pytest.mark.parametrize("layers", [
    {"local": {"select": {"step": 2}, "attention": {"sparsity": {"kind": "sliding_window", "window": 5}}}},
    {"mqa": {"select": [0], "attention": {"n_kv_heads": 1}}},
    {"wide": {"select": [1, 2], "ffn": {"kind": "glu", "hidden_dim": 40}}},
], ids=["window-moves-model-wide", "kv-group", "ffn-group"])
def test_the_new_fields_at_their_defaults_leave_a_layered_specs_hash_as_it_was(layers):
    """Per-layer groups rewrite the model-wide attention in the canonical form: the rope fields added later (partial,
    layout) must still be left out there at their defaults (the model hash of every spec written before them), and
    be part of it when set."""
    from archspec.spec import canonical_json, model_hash, model_json

    base = {"vocab_size": 32, "context_length": 16, "d_model": 32, "n_layers": 3, "attention": {"n_heads": 4},
            "layers": layers}
    plain = load_spec_dict({"name": "x", "model": base})
    for text in (canonical_json(plain), model_json(plain)):
        assert '"partial"' not in text and '"layout"' not in text, text
    explicit = load_spec_dict({"name": "x", "model": {**base, "attention": {
        "n_heads": 4, "positional": {"kind": "rope", "partial": 1.0, "layout": "half"}}}})
    assert model_hash(explicit) == model_hash(plain)
    changed = load_spec_dict({"name": "x", "model": {**base, "attention": {
        "n_heads": 4, "positional": {"kind": "rope", "partial": 0.5, "layout": "interleaved"}}}})
    assert model_hash(changed) != model_hash(plain) and '"partial":0.5' in canonical_json(changed)
