"""MPT both ways (issue 26): ALiBi (alibi_bias_max 8: BLOOM's slopes), a fused Wqkv, no biases, the 4·d_model GELU
MLP, attn_config.softmax_scale as model.attention.scale. Logits within 1e-4 of transformers' MptForCausalLM (fp32,
random tiny config), greedy generation equal, exact round trips, and what transformers' MPT hardcodes refused."""

from __future__ import annotations

import pytest
import torch

from archspec.codegen import generate
from archspec.hf import config_from_spec, spec_from_config, state_from_hf, state_to_hf
from archspec.hf.types import TYPES
from archspec.kinds.hf import HFUnsupported
from archspec.spec import load_spec_dict, model_hash
from tests.test_hf_bloom import assert_greedy_equal
from tests.test_hf_equivalence import _load_exactly, _randomise

transformers = pytest.importorskip("transformers")

VOCAB, CONTEXT = 96, 32


def _mpt_spec(n_heads: int = 6, d: int = 48, **attention):
    return load_spec_dict({"name": "mpt-equiv", "model": {
        "vocab_size": VOCAB, "context_length": CONTEXT, "d_model": d, "n_layers": 2,
        "norm": {"kind": "layernorm", "eps": 1e-5, "bias": False},
        "attention": {"n_heads": n_heads, "positional": {"kind": "alibi"}, **attention},
        "ffn": {"kind": "mlp", "activation": "gelu", "hidden_dim": 4 * d, "bias": False}}})


def _pair(spec, seed=1):
    ours = generate(spec, write=False).Model()
    _randomise(ours, seed=seed)
    hf_type, config = config_from_spec(spec)
    assert hf_type.model_type == "mpt"
    hf = transformers.MptForCausalLM(transformers.MptConfig(**{k: v for k, v in config.items()
                                                               if k not in ("model_type", "architectures")}))
    _load_exactly(hf, state_to_hf(spec.model, TYPES["mpt"], ours.state_dict()))
    return ours.eval(), hf.eval()


@pytest.mark.parametrize("n_heads, scale", [(6, None), (4, 0.3), (5, None)], ids=["6-heads", "4-heads-scaled", "5-heads"])
def test_mpt_logits_match_transformers(n_heads, scale):
    spec = _mpt_spec(n_heads, d=8 * n_heads, **({"scale": scale} if scale else {}))
    ours, hf = _pair(spec)
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = ours(idx), hf(input_ids=idx).logits
    assert a.abs().max() > 0.1
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_mpt_greedy_generation_equals_transformers():
    assert_greedy_equal(*_pair(_mpt_spec(6, scale=0.5), seed=3))


def test_mpt_config_and_weights_round_trip_exactly():
    spec = _mpt_spec(6, scale=0.25)
    hf_type, config = config_from_spec(spec)
    assert config["attn_config"]["softmax_scale"] == 0.25 and "attn_config.softmax_scale" not in config
    back = load_spec_dict(spec_from_config(config, "config.json", "mpt-equiv"))
    assert model_hash(back) == model_hash(spec)
    # what transformers itself writes reads back as the same model
    data = transformers.MptConfig(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")}).to_dict()
    assert model_hash(load_spec_dict(spec_from_config(data, "config.json", "mpt-equiv"))) == model_hash(spec)
    ours = generate(spec, write=False).Model()
    _randomise(ours, seed=5)
    state = ours.state_dict()
    again = state_from_hf(spec.model, hf_type, state_to_hf(spec.model, hf_type, state), "model.safetensors")
    assert set(again) == set(state) and all(torch.equal(again[k], state[k]) for k in state)


@pytest.mark.parametrize("change, words", [
    ({"expansion_ratio": 8}, "expansion_ratio: 8"), ({"no_bias": False}, "no_bias: False"),
    ({"attn_config": {"clip_qkv": 6.0}}, "clip_qkv: 6.0"), ({"attn_config": {"alibi_bias_max": 16}}, "alibi_bias_max"),
    ({"attn_config": {"qk_ln": True}}, "qk_ln"), ({"logit_scale": 0.5}, "logit_scale"),
], ids=["expansion", "bias", "clip", "bias-max", "qk-ln", "logit-scale"])
def test_what_transformers_mpt_hardcodes_is_refused_on_import(change, words):
    data = transformers.MptConfig(d_model=32, n_heads=4, n_layers=1, max_seq_len=16, vocab_size=VOCAB).to_dict()
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    with pytest.raises(HFUnsupported, match=words):
        spec_from_config(data, "config.json", "mpt")
