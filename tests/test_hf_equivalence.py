"""Generated models against independent implementations: HF transformers' GPT-2 and Llama, weights copied across.

Every parameter is re-drawn at random first (norm weights and biases included, at a scale that keeps every
non-linearity in play), so a mapping or a formula that only agrees at the default init (ones, zeros) fails.
fp32, eager attention on both sides, tiny dimensions; logits must agree within 1e-4.

The weight-name mapping is the one `archspec export-hf` uses: each kind's `hf_weights`, assembled by archspec.hf
(tests/test_hf_interop.py runs the commands themselves, both ways).
"""

from __future__ import annotations

import pytest
import torch

from archspec.codegen import generate
from archspec.hf import state_to_hf
from archspec.hf.types import TYPES
from archspec.spec import load_spec_dict

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
VOCAB, CONTEXT, T = 96, 32, 24


def _generated(model: dict, name: str):
    spec = load_spec_dict({"name": name, "model": {"vocab_size": VOCAB, "context_length": CONTEXT, **model}})
    return spec, generate(spec, write=False).Model()


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Every parameter redrawn: N(0, 0.1) for matrices, N(1, 0.2) for norm weights, N(0, 0.1) for biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def _load_exactly(hf: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load every HF parameter from `state`; a parameter left out or a name HF lacks is a failed mapping."""
    own = {k for k, _ in hf.named_parameters()}
    assert set(state) == own, f"unmapped: {sorted(own - set(state))}; unknown: {sorted(set(state) - own)}"
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and not (set(missing) & own)


def _compare(ours: torch.nn.Module, hf: torch.nn.Module, seed: int) -> None:
    ours.eval(), hf.eval()
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        a = ours(idx)
        b = hf(input_ids=idx).logits
    assert a.shape == b.shape == (2, T, VOCAB)
    assert a.abs().max() > 0.1  # the logits are not trivially equal (e.g. all near zero)
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


# ── GPT-2 ────────────────────────────────────────────────────────────────────────────────────────────────────────


def test_gpt2_with_gelu_matches_hf():
    d, n_layers, n_heads = 48, 2, 4
    spec, ours = _generated({
        "d_model": d, "n_layers": n_layers, "norm": {"kind": "layernorm", "eps": 1e-5, "bias": True},
        "attention": {"n_heads": n_heads, "bias": True, "positional": {"kind": "learned"}},
        "ffn": {"kind": "mlp", "activation": "gelu", "hidden_dim": 4 * d, "bias": True}, "tie_embeddings": True,
    }, "gpt2-equiv")
    _randomise(ours, seed=1)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=d, n_layer=n_layers, n_head=n_heads, n_inner=4 * d,
        activation_function="gelu",  # exact erf GELU, as F.gelu; HF's default "gelu_new" is the tanh form
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, attn_implementation="eager",
    )
    hf = transformers.GPT2LMHeadModel(config)
    _load_exactly(hf, state_to_hf(spec.model, TYPES["gpt2"], ours.state_dict()))  # tied: wte, loaded once
    _compare(ours, hf, seed=2)


# ── Llama ────────────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("n_kv_heads,tied", [(2, True), (1, False)], ids=["gqa-tied", "mqa-untied"])
def test_llama_matches_hf(n_kv_heads, tied):
    d, n_layers, n_heads, head_dim, hidden, theta, eps = 64, 2, 4, 16, 88, 500.0, 1e-6
    spec, ours = _generated({
        "d_model": d, "n_layers": n_layers, "norm": {"kind": "rmsnorm", "eps": eps},
        "attention": {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim, "bias": False,
                      "positional": {"kind": "rope", "theta": theta}},
        "ffn": {"kind": "glu", "activation": "silu", "hidden_dim": hidden, "bias": False}, "tie_embeddings": tied,
    }, f"llama-equiv-{n_kv_heads}")
    _randomise(ours, seed=3 + n_kv_heads)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=d, intermediate_size=hidden, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
        max_position_embeddings=CONTEXT, rms_norm_eps=eps, rope_parameters={"rope_type": "default", "rope_theta": theta},
        attention_bias=False, mlp_bias=False, tie_word_embeddings=tied, hidden_act="silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager",
    )
    hf = transformers.LlamaForCausalLM(config)
    _load_exactly(hf, state_to_hf(spec.model, TYPES["llama"], ours.state_dict()))
    _compare(ours, hf, seed=5)


# ── GLM: partial rotation in (2i, 2i + 1) pairs ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("partial,scaling", [
    (0.5, None),  # GLM-4-9B's half of each head
    (0.25, {"kind": "linear", "factor": 2.0}),
    (1.0, {"kind": "yarn", "factor": 6.0, "original_context_length": 8, "mscale": 0.9, "mscale_all_dim": 0.4}),
    (0.75, {"kind": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 3.0,
            "original_context_length": 16}),
], ids=["half-default", "quarter-linear", "whole-yarn", "three-quarters-llama3"])
def test_glm_matches_hf(partial, scaling):
    d, n_layers, n_heads, n_kv_heads, head_dim, hidden, theta, eps = 64, 2, 4, 2, 16, 88, 800.0, 1e-6
    spec, ours = _generated({
        "d_model": d, "n_layers": n_layers, "norm": {"kind": "rmsnorm", "eps": eps},
        "attention": {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim, "qkv_bias": True,
                      "out_bias": False, "positional": {"kind": "rope", "theta": theta, "partial": partial,
                                                        "layout": "interleaved", "scaling": scaling}},
        "ffn": {"kind": "glu", "activation": "silu", "hidden_dim": hidden, "bias": False}, "tie_embeddings": False,
    }, f"glm-equiv-{int(100 * partial)}")
    _randomise(ours, seed=8)
    rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}
    if scaling is not None:
        hf_keys = {"original_context_length": "original_max_position_embeddings"}
        rope.update({hf_keys.get(k, k): v for k, v in scaling.items() if k != "kind"}, rope_type=scaling["kind"])
    config = transformers.GlmConfig(
        vocab_size=VOCAB, hidden_size=d, intermediate_size=hidden, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
        max_position_embeddings=CONTEXT, rms_norm_eps=eps, rope_parameters=rope, attention_bias=True,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        attn_implementation="eager",
    )
    hf = transformers.GlmForCausalLM(config)
    _load_exactly(hf, state_to_hf(spec.model, TYPES["glm"], ours.state_dict()))
    _compare(ours, hf, seed=9)
