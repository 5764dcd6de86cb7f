"""RoPE in a generated module against a formula written here, independently of the template.

Reference (Su et al., 2021, eq. 34 in complex form, LLaMA's "rotate half" pairing): split a head vector x of size d
into halves a, b and read z_i = a_i + i·b_i; position m multiplies z_i by exp(i·m·θ^(-2i/d)). Computed in float64
with Python complex numbers, from the spec's head_dim and theta alone.
"""

from __future__ import annotations

import cmath

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.codegen import generate
from archspec.spec import load_spec_dict

CONTEXT = 64


def _rope_module(head_dim: int, theta: float):
    n_heads = 2
    spec = load_spec_dict({"name": "rope-check", "model": {
        "vocab_size": 32, "context_length": CONTEXT, "d_model": n_heads * head_dim, "n_layers": 1,
        "attention": {"n_heads": n_heads, "head_dim": head_dim, "positional": {"kind": "rope", "theta": theta}},
        "ffn": {"kind": "mlp", "activation": "relu", "hidden_dim": 8},
    }})
    gen = generate(spec, write=False)
    model = gen.Model()
    cos, sin = model.rope(CONTEXT)

    def rotate(x: torch.Tensor, m: int) -> torch.Tensor:  # x: (head_dim,) at position m
        return gen.module.apply_rope(x.view(1, 1, 1, -1), cos[m : m + 1], sin[m : m + 1]).view(-1)

    return rotate


def _reference(x: list[float], m: int, theta: float) -> list[float]:
    d = len(x)
    half = d // 2
    out = [0.0] * d
    for i in range(half):
        z = complex(x[i], x[i + half]) * cmath.exp(1j * m * theta ** (-2 * i / d))
        out[i], out[i + half] = z.real, z.imag
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
