"""BLOOM both ways (issue 26): ALiBi with BLOOM's slopes (non-power-of-two head counts), the LayerNorm after the
embeddings, q/k/v fused per head, the 4·hidden tanh-GELU MLP. Logits within 1e-4 of transformers' BloomForCausalLM
(fp32, random tiny config, every weight redrawn), greedy generation equal, exact weight round trip, the context
length an imported config lacks chosen and said, and what bloom cannot express refused by field."""

from __future__ import annotations

import warnings

import pytest
import torch

from archspec.codegen import generate
from archspec.errors import Caution
from archspec.hf import config_from_spec, spec_from_config, state_from_hf, state_to_hf
from archspec.hf.types import BLOOM_CONTEXT, TYPES
from archspec.kinds.hf import HFUnsupported
from archspec.spec import load_spec_dict, model_hash
from tests.test_hf_equivalence import _load_exactly, _randomise

transformers = pytest.importorskip("transformers")

VOCAB, CONTEXT = 96, 32


def _bloom_spec(n_heads: int = 6, d: int = 48, n_layers: int = 2, **changes):
    model = {"vocab_size": VOCAB, "context_length": CONTEXT, "d_model": d, "n_layers": n_layers,
             "norm": {"kind": "layernorm", "eps": 1e-5, "bias": True}, "embedding_norm": True,
             "attention": {"n_heads": n_heads, "bias": True, "positional": {"kind": "alibi"}},
             "ffn": {"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 4 * d, "bias": True},
             "tie_embeddings": True, **changes}
    return load_spec_dict({"name": "bloom-equiv", "model": model})


def _pair(n_heads: int, seed: int = 1):
    spec = _bloom_spec(n_heads)
    ours = generate(spec, write=False).Model()
    _randomise(ours, seed=seed)
    hf_type, config = config_from_spec(spec)
    assert hf_type.model_type == "bloom"
    hf = transformers.BloomForCausalLM(transformers.BloomConfig(**{k: v for k, v in config.items()
                                                                     if k not in ("model_type", "architectures")},
                                                                  attn_implementation="eager"))
    _load_exactly(hf, state_to_hf(spec.model, TYPES["bloom"], ours.state_dict()))
    return spec, ours.eval(), hf.eval()


@pytest.mark.parametrize("n_heads", [6, 4, 3], ids=["6-heads", "4-heads", "3-heads"])
def test_bloom_logits_match_transformers(n_heads):
    spec, ours, hf = _pair(n_heads)
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = ours(idx), hf(input_ids=idx).logits
    assert a.abs().max() > 0.1
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def assert_greedy_equal(ours, hf, vocab: int = VOCAB) -> None:
    """20 greedy tokens after a 5-token prompt: ours (KV-cached) and transformers' `generate`, token for token."""
    prompt = torch.randint(0, vocab, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        mine = ours.generate(prompt, 20, temperature=0)
        theirs = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(mine, theirs)


def test_bloom_greedy_generation_equals_transformers():
    spec, ours, hf = _pair(6, seed=3)
    assert_greedy_equal(ours, hf)


def test_bloom_config_and_weights_round_trip_exactly():
    spec = _bloom_spec(5, d=40)
    hf_type, config = config_from_spec(spec)
    back = load_spec_dict(spec_from_config(config, "config.json", "bloom-equiv"))
    assert model_hash(back) == model_hash(spec)
    ours = generate(spec, write=False).Model()
    _randomise(ours, seed=5)
    state = ours.state_dict()
    again = state_from_hf(spec.model, hf_type, state_to_hf(spec.model, hf_type, state), "model.safetensors")
    assert set(again) == set(state) and all(torch.equal(again[k], state[k]) for k in state)
    # HF's query_key_value rows are grouped by head: head 0's q, k, v first
    hf_state = state_to_hf(spec.model, hf_type, state)
    qkv = state["blocks.0.attn.qkv_proj.weight"]
    theirs = hf_state["transformer.h.0.self_attention.query_key_value.weight"]
    torch.testing.assert_close(theirs[8:16], qkv[40:48], atol=0, rtol=0)  # head 0's keys (head_dim 8)


def test_a_released_style_bloom_config_imports_with_its_context_length_said():
    data = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4).to_dict()
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", Caution)
        spec = load_spec_dict(spec_from_config(data, "config.json", "bloom-like"))
    m = spec.model
    assert m.context_length == BLOOM_CONTEXT and m.embedding_norm and m.attention.positional.kind == "alibi"
    assert m.ffn.hidden_dim == 4 * 32 and m.ffn.activation == "gelu_tanh" and m.attention.bias
    assert any("no context length" in str(n.message) and str(BLOOM_CONTEXT) in str(n.message) for n in notes)


@pytest.mark.parametrize("changes, field", [
    ({"attention": {"n_heads": 6, "n_kv_heads": 2, "bias": True, "positional": {"kind": "alibi"}}},
     "model.attention.n_kv_heads"),
    ({"ffn": {"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 100, "bias": True}}, "model.ffn.hidden_dim"),
    ({"ffn": {"kind": "mlp", "activation": "relu", "hidden_dim": 192, "bias": True}}, "model.ffn.activation"),
    ({"attention": {"n_heads": 6, "bias": True, "softcap": 5.0, "positional": {"kind": "alibi"}}},
     "model.attention.softcap"),
], ids=["gqa", "hidden", "activation", "softcap"])
def test_what_bloom_cannot_express_is_refused_by_field(changes, field):
    with pytest.raises(HFUnsupported) as info:
        config_from_spec(_bloom_spec(**changes))
    assert any(r.startswith(f"bloom: {field}") for r in info.value.problems), info.value.problems
